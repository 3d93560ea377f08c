"""Pulumi program of every dlinfra stack; the stack's name (`<env>-<region>`, `<env>-global`) picks its role."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # Pulumi runs this file from stacks/; our packages live at the project root
    sys.path.insert(0, str(ROOT))

from stacks.program import main  # noqa: E402

main(ROOT)
