"""Run a benchmark with the project's own interpreter: `python bench/X.py` works with any Python on the PATH.

The benchmarks import dlinfra, pulumi and the YAML libraries, which live in the project's .venv (made by .ci/setup).
Started by another interpreter, a benchmark replaces itself with the same command under .venv/bin/python; without a
.venv it stops with one line saying how to make one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def use_project_python() -> None:
    """Re-run this command under .venv/bin/python unless it already runs there (or its packages are importable)."""
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        return
    try:
        import pulumi  # noqa: F401
        import yaml  # noqa: F401
    except ImportError:
        if not VENV_PYTHON.exists():
            sys.exit(f"{sys.argv[0]}: needs the project's virtualenv; run `bash .ci/setup` in {ROOT} first")
        os.execv(VENV_PYTHON, [str(VENV_PYTHON), *sys.argv])
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


if __name__ == "__main__":  # `python bench/project_python.py` prints the interpreter the benchmarks run under
    use_project_python()
    print(sys.executable)
