"""The GPU health check, loaded from where Chef installs it from (chef/cookbooks/dlinfra_gpu/files/gpu_check.py): a
file of the cookbook, not a module of a package, since site machines converge from a copy of chef/ alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).parents[2] / "chef" / "cookbooks" / "dlinfra_gpu" / "files" / "gpu_check.py"


def cookbook_file(name: str, path: Path) -> ModuleType:
    """A cookbook's Python file as the module `name`, loaded once per test session."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


gpu_check = cookbook_file("gpu_check", PATH)
