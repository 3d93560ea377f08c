"""dlinfra's two warm servers (dlinfra.serving.forkserver): one for dlinfra's own commands, one for checkov in its venv.

Each is keyed by its interpreter, the files of its program and the folder of its installed packages, so a client
finds the server of exactly the code it would run itself, or none. `dlinfra server start` starts both; a command
uses one only when it is running, and `DLINFRA_SERVER=off` makes every command run in its own process.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from dlinfra import PROJECT_ROOT
from dlinfra.serving.forkserver import code_key, settings, socket_path

# The program a served dlinfra command runs: what `import` reads and what the commands read as data.
SERVED_DIRS = ("dlinfra", "components", "stacks", "policy")
SERVED_FILES = ("Pulumi.yaml", "pyproject.toml")
IDLE_SECONDS = 1800.0  # a server nobody has used for this long exits

# What a dlinfra command imports, imported once by the server: every command module, the programs' modules (each
# role's, which stacks.program imports only when a stack of that role runs), the checks, and (warm) the provider SDK
# modules of every resource type dlinfra declares.
DLINFRA_PRELOAD = (
    "dlinfra.cli.main",
    "dlinfra.offline.preview",
    "dlinfra.checks.runner",
    "dlinfra.checks.reach.check",
    "dlinfra.review.diff.revisions",
    "dlinfra.review.diff.render",
    "dlinfra.review.cost",
    "stacks.program",
    "stacks.regional",
    "stacks.in_cluster",
    "stacks.global_stack",
)
DLINFRA_WARM = (
    "dlinfra.offline.parallel:preload_sdk_modules",
    # The packaged data tables that validating a fleet and running its stacks read, each parsed once per process
    # (functools.cache): 25 ms of every served preview or diff, parsed in its fork again without these.
    "dlinfra.model.instances:packaged_types",
    "dlinfra.model.quotas:table",
    "dlinfra.model.gpu_sharing:table",
    "dlinfra.model.gpu_health:table",
    "dlinfra.model.regions:known_regions",
)
# checkov reads these when it is imported, so the server is started with them (dlinfra.checks.checkov).
CHECKOV_ENV = {"LOG_LEVEL": "WARNING", "BC_SKIP_MAPPING": "TRUE"}


@dataclass(frozen=True)
class Served:
    """One server: its name, the socket of its code's key, and how to start it."""

    name: str
    socket: Path
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def mode() -> str:
    """DLINFRA_SERVER: "off" (every command runs in its own process), "require" (a command no server serves is an
    error: a CI job or a benchmark that started the servers and must not measure without them), else "auto"."""
    value = os.environ.get("DLINFRA_SERVER", "").strip().lower()
    if value in ("off", "0", "false", "no"):
        return "off"
    return "require" if value == "require" else "auto"


def enabled() -> bool:
    """Whether commands may use a running server."""
    return mode() != "off"


def dlinfra_server(root: Path = PROJECT_ROOT, *, idle: float = IDLE_SECONDS) -> Served:
    """The server of dlinfra's commands, with this interpreter, environment settings and the code of `root`."""
    packages = Path(sysconfig.get_paths()["purelib"])
    key = code_key(
        (sys.prefix, os.path.realpath(sys.executable), sys.version, str(root), *settings(os.environ)),
        [root / name for name in (*SERVED_DIRS, *SERVED_FILES)] + [packages],
        shallow={packages},
    )
    path = socket_path("dlinfra", key)
    command = [sys.executable, "-m", "dlinfra.serving.forkserver", "--socket", str(path)]
    command += ["--entry", "dlinfra.cli.main:served", *_record("dlinfra", root)]
    command += [arg for name in DLINFRA_PRELOAD for arg in ("--preload", name)]
    command += [arg for spec in DLINFRA_WARM for arg in ("--warm", spec)]
    return Served("dlinfra", path, (*command, "--idle", str(idle)))


def checkov_server(root: Path = PROJECT_ROOT, *, idle: float = IDLE_SECONDS) -> Served | None:
    """The server of checkov in the project's .venv-checkov; None when that venv is not there."""
    python = root / ".venv-checkov" / "bin" / "python"
    packages = sorted((root / ".venv-checkov" / "lib").glob("python*/site-packages"))
    if not python.exists() or not packages:
        return None
    program = Path(__file__).resolve().with_name("forkserver.py")
    fixed = [f"{k}={v}" for k, v in sorted(CHECKOV_ENV.items())]
    key = code_key(
        (str(python), str(root), *fixed, *settings(os.environ, python=False)),  # -I: PYTHON* variables unread
        [program, *packages],
        shallow=set(packages),
    )
    path = socket_path("checkov", key)
    # -I: checkov's interpreter, isolated (no script folder on sys.path, no PYTHON* variables, no user site).
    command = [str(python), "-I", str(program), "--socket", str(path), "--entry", "checkov.main:Checkov"]
    command += ["--kind", "class", "--preload", "checkov.main", "--idle", str(idle), *_record("checkov", root)]
    return Served("checkov", path, tuple(command), tuple(sorted(CHECKOV_ENV.items())))


def _record(name: str, root: Path) -> list[str]:
    """What the server writes beside its socket, with its pid: `dlinfra server status` and `stop` read it."""
    return ["--record", json.dumps({"name": name, "root": str(root), "prefix": sys.prefix})]
