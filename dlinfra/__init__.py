"""dlinfra: infrastructure as code for deep-learning research on AWS and physical GPU sites.

The packages are floors (docs/architecture.md); each imports only from the floors below it, which
`lint-imports` (the contract in pyproject.toml) keeps.
"""

from pathlib import Path

__version__ = "0.1.0"

# The project checkout: Pulumi.yaml, stacks/, components/, the .venv-checkov beside them.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
