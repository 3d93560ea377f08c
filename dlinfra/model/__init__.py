"""Floor 1, the pure model: the fleet file and everything planned from it without a cloud (address plan, names and
tags, stack roles, Kueue quotas, site networks, DNS) and the data tables it reads (instance types, regions, EKS
versions, AMIs, replacement rules).

May import only dlinfra.errors, dlinfra.files and itself. No pulumi, no cloud clients (an import-linter contract).
"""
