"""Floor 8, the review tools: what a change does (diff), what the plans cost (cost), and who can reach and do what
(access, with `principals` bridging to the reachability engine).

May import dlinfra.checks, policy, dlinfra.offline, dlinfra.model and the bottom modules.
"""
