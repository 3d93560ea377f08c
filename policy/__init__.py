"""Floor 6, the CrossGuard policy pack: `pulumi preview --policy-pack policy` runs `__main__.py`; the rules in
`dlinfra_policy.rules` are plain functions that `dlinfra check` runs too.

May import dlinfra.offline (the SDK's input shapes), dlinfra.model and the bottom modules.
"""
