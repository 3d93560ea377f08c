"""Checks before apply: dlinfra's CrossGuard rules and checkov over the offline plan exports."""
