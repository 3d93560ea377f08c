"""Floor 7, the checks before apply, over the offline plan exports: the CrossGuard rules (through policy/),
checkov on a Terraform-plan-shaped export, reachability (`reach`), static checks of chef/, and their report.

May import policy, dlinfra.offline, dlinfra.model and the bottom modules.
"""
