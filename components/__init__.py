"""Floor 3, the components: one Pulumi ComponentResource per file (type token `dlinfra:<area>:<Class>`), taking
values already planned; `charts/` holds the values of the Helm charts they install.

May import dlinfra.model, dlinfra.render and the bottom modules; never stacks/ or anything above.
"""
