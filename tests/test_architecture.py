"""The floors stay visible: the import-linter contracts hold and catch an upward import, no module imports
itself back through others, dlinfra/ keeps its handful of loose modules, and modules stay one concern."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT

PACKAGES = ("dlinfra", "stacks", "components", "policy")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# A module may be longer than this only when it is one concern that reads best whole, and says so.
MAX_LINES = 600
WHOLE = "reads best whole"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter on a checkout (its pyproject's contracts, its own packages first on the path)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_contracts_hold() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("dlinfra/model/naming.py", "from dlinfra.cli import main as _upward"),  # the model reaching the CLI
        ("components/nodepool.py", "from stacks import context as _upward"),  # a component reaching its stack
        ("dlinfra/render/nodeadm.py", "import pulumi as _upward"),  # a renderer importing Pulumi
    ],
)
def test_an_upward_import_breaks_a_contract(tmp_path: Path, module: str, upward: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / module).open("a") as f:
        f.write(f"\n{upward}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    importer = module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in done.stdout and importer in done.stdout, done.stdout


def test_no_import_cycles() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            # A module imported by one it (indirectly) imports closes a cycle.
            if graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} -> {imported}")
    assert cycles == []


def test_dlinfra_keeps_a_handful_of_loose_modules() -> None:
    loose = sorted(p.name for p in (ROOT / "dlinfra").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py", "files.py"]


def test_packages_say_what_they_may_import() -> None:
    floors = [ROOT / "dlinfra" / d for d in ("model", "render", "offline", "checks", "review", "ops", "cli")]
    floors += [ROOT / p for p in ("stacks", "components", "policy")]
    for folder in floors:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert "import" in doc, f"{folder.relative_to(ROOT)}/__init__.py: say what the package may import"


def test_modules_are_one_concern() -> None:
    too_long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            lines = text.count("\n")
            if lines > MAX_LINES and WHOLE not in (ast.get_docstring(ast.parse(text)) or ""):
                too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert too_long == [], f"split these, or say in the docstring why each {WHOLE}"
