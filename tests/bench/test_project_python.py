"""The benchmarks run with whatever Python starts them: they re-run under the project's .venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_a_python_without_the_projects_packages_hands_over_to_the_venv() -> None:
    # The interpreter the .venv was made from, with -S (no site-packages): neither pulumi nor yaml imports, as with a
    # bare system Python.
    system_python = Path(sys.base_prefix) / "bin" / "python3"
    proc = subprocess.run(
        [str(system_python), "-S", str(ROOT / "bench" / "project_python.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).parent == ROOT / ".venv" / "bin"
