"""Reading a fleet file: parse (with lines for errors), validate the models and their cross-checks, and report
every problem as one FleetError naming the file, line, key and value."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from dlinfra.errors import FleetError
from dlinfra.model import dev_boxes, eks, kueue, team_storage
from dlinfra.model.fleet import checks
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.textcache import last_by_text


@dataclass(frozen=True)
class LoadedFleet:
    """A parsed fleet with where it came from, so later errors can name the file."""

    fleet: Fleet
    path: Path


def _yaml_line(data: Any, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest key of `loc` that the round-trip YAML tree knows."""
    line = None
    node = data
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
        else:
            break
    return line


def key_line(path: Path, key: str) -> int | None:
    """1-based line of a dotted key (`environments.prod.ci`) in a fleet file, for errors found after loading."""
    return _yaml_line(parse_yaml(path), key.split("."))


def parse_yaml(path: Path) -> Any:
    """Round-trip YAML load that rejects duplicate keys and reports parse errors with a line."""
    yaml = YAML(typ="rt")
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetError(f"cannot read: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = (exc.problem or exc.context or "malformed YAML").strip()
        if "duplicate key" in str(exc):
            problem = f"duplicate key: {str(exc).split('found duplicate key', 1)[-1].split(chr(10))[0].strip()}"
        raise FleetError(f"malformed YAML at {where}: {problem}", file=str(path)) from None


def version_lifecycle(loaded: LoadedFleet, on: datetime.date) -> list[str]:
    """Warnings for cluster versions near the end of their support; FleetError for one past it.

    Time-dependent, so not part of the model: the CLI and the stack program call it with today's date.
    """
    warnings = []
    for env_name, env in loaded.fleet.environments.items():
        assert env.kubernetes.upgrade_policy is not None  # the model requires it
        state = eks.lifecycle(env.kubernetes.version, env.kubernetes.upgrade_policy, on)
        key = f"environments.{env_name}.kubernetes.version"
        if state.level == "error":
            raise FleetError(state.message, file=str(loaded.path), key=key)
        if state.level == "warning":
            warnings.append(f"{loaded.path}: {key}: {state.message}")
    return warnings


def load_fleet(path: str | Path) -> LoadedFleet:
    """Parse and validate a fleet file, with the lab's catalog beside it (dlinfra.model.catalog) loaded first and
    merged over the packaged tables; raises FleetError naming the file and key."""
    from dlinfra.model import catalog

    path = Path(path)
    lab = catalog.load(catalog.beside(path))
    catalog.install(lab)
    return LoadedFleet(fleet=_fleet_of(path, lab.digest), path=path)


@last_by_text
def _fleet_of(path: Path, _catalog: str = "") -> Fleet:
    """The validated fleet; `_catalog` (the catalog's digest) is part of the cache key, as validation reads it."""
    return validate_data(parse_yaml(path), path)  # parse_yaml reports an unreadable file


def validate_data(data: Any, path: Path) -> Fleet:
    """The fleet model of parsed fleet data (as read, or as a command is about to write it), or the FleetError
    naming the file, line, key and value: every command refuses a fleet in the same words."""
    if not isinstance(data, Mapping):
        raise FleetError("the top level must be a mapping (project, regions, environments, ...)", file=str(path))
    try:
        fleet = Fleet.model_validate(data)
        checks.check(fleet)
        kueue.check_fleet(fleet, source=str(path))  # quotas span environments: every command refuses them first
        team_storage.check_fleet(fleet)  # POSIX ids of teams and people must differ
        dev_boxes.check_fleet(fleet)  # each box's person, region, zone and type exist in its environment
    except ValidationError as exc:
        raise _fleet_error(path, data, exc) from None
    except FleetError as exc:
        line = _yaml_line(data, (exc.key or "").split(".")) if exc.key else None
        raise FleetError(exc.detail, file=f"{path}:{line}" if line else str(path), key=exc.key) from None
    return fleet


_ECHO_LIMIT = 60  # characters of a bad value repeated in an error


def _echo(value: Any, message: str) -> str:
    """` (got <value>)` for a scalar the message does not already show, truncated; else nothing."""
    if isinstance(value, Mapping | list | tuple) or str(value) in message:
        return ""
    shown = repr(value)
    return f" (got {shown[: _ECHO_LIMIT - 3]}...)" if len(shown) > _ECHO_LIMIT else f" (got {shown})"


def _fleet_error(path: Path, data: Any, exc: ValidationError) -> FleetError:
    messages = []
    first_key = None
    bad_names: set[str] = set()
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained")))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if any(key.startswith(f"{k}.") for k in bad_names):
            continue  # the entry's name is already reported; its body errors would only add noise
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see README 'Fleet file reference')"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
            key = ".".join(str(p) for p in loc)
            msg = "not a valid name: names are 2-24 lower-case letters, digits and '-', starting with a letter"
        if msg.startswith("not a valid name"):
            bad_names.add(key)
        elif err["type"] not in ("missing", "extra_forbidden"):
            msg += _echo(err.get("input"), msg)
        line = _yaml_line(data, loc)
        messages.append(f"{path}:{line}: {key}: {msg}" if line else f"{path}: {key}: {msg}")
        first_key = first_key or key
    error = FleetError("\n".join(messages))
    error.file, error.key = str(path), first_key
    return error
