"""dlinfra's policy rules, one module per area: plain functions over a resource's type, camelCase inputs and options.

`catalog.RULES` lists them for the CrossGuard pack and `dlinfra check`; `core` holds what they share. Modules here
import only each other and dlinfra.model (pure: no pulumi), and importing them has no side effects.
"""
