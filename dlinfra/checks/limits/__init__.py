"""Quotas and address capacity over the offline plans: what the fleet at its largest (every pool at its maximum
size) asks of AWS's default quotas and Kubernetes' limits, counted per scope, before anything is applied.

The quotas are data (dlinfra/data/quotas.yaml, read by dlinfra.model.quotas) with their source pages; `scope`
holds what every count shares, `network` and `compute` count, and `check` judges each count against its quota.
Per-region quotas are per account: environments name theirs (`environments.<env>.account`), and those that do not
are counted as sharing one account, the assumption that cannot hide a shortfall. Part of the checks floor: it may
import the model and the plan exports it is given, nothing above the checks.
"""
