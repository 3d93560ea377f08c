"""The GPU health check, loaded from where Chef installs it from (chef/cookbooks/dlinfra_gpu/files/gpu_check.py): a
file of the cookbook, not a module of a package, since site machines converge from a copy of chef/ alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).parents[2] / "chef" / "cookbooks" / "dlinfra_gpu" / "files" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


gpu_check = sys.modules.get("gpu_check") or _load()
