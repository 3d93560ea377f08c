"""Floor 10, the command line: one module per command group (fleet, preview, network, checks, access, cost, pools,
what_happened, doctor), `common` for what they share, `main` for the parser and the entry point.

May import every floor below; nothing imports it.
"""
