"""Floor 2, the renderers: pure functions that turn planned values into the files dlinfra ships to machines
(strongSwan, FRR, nftables, nodeadm, OpenVPN profiles), from jinja2 templates beside them.

May import dlinfra.model and the bottom modules. No pulumi, no cloud clients.
"""
