"""Reading a stack's outputs, as `pulumi stack output --json --show-secrets` prints them, with errors that say
which stack to apply or how to export them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError

# What `pulumi stack output --json` prints for a secret without --show-secrets.
SECRET_PLACEHOLDER = "[secret]"


def load_outputs(path: Path) -> dict[str, Any]:
    """The JSON of `pulumi stack output --json --show-secrets`."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise DlinfraError(f"cannot read stack outputs: {exc.strerror}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise DlinfraError(
            f"not JSON ({exc.msg} at line {exc.lineno}); "
            "expected the output of `pulumi stack output --json --show-secrets`",
            file=str(path),
        ) from None
    if not isinstance(data, dict):
        raise DlinfraError("expected a JSON object of stack outputs", file=str(path))
    return data


def check_stack(outputs: Mapping[str, Any], env: str, region: str, *, source: str) -> None:
    """Refuse outputs of another stack than `<env>-<region>`."""
    got = (outputs.get("environment"), outputs.get("region"))
    if got != (env, region):
        raise DlinfraError(
            f"these are the outputs of stack {got[0]}-{got[1]}, but {env}-{region} is needed; run "
            f"`pulumi stack output --json --show-secrets --stack {env}-{region}`",
            file=source,
        )


def require_output(outputs: Mapping[str, Any], key: str, *, source: str, stack: str) -> Any:
    value = outputs.get(key)
    if value is None:
        raise DlinfraError(f"no output {key!r}: run `pulumi up --stack {stack}` first", file=source, key=key)
    if value == SECRET_PLACEHOLDER:
        raise DlinfraError(
            "the value is masked; export the outputs with `pulumi stack output --json --show-secrets`",
            file=source,
            key=key,
        )
    return value


def as_int(value: Any, what: str, source: str) -> int:
    # The offline engine hands numbers back as floats; the CLI's JSON has integers.
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise DlinfraError(f"expected an integer, got {value!r}", file=source, key=what)
    return int(value)


def read_outputs(stack: str, path: Path | None) -> tuple[Mapping[str, Any], str]:
    """A stack's outputs, and where they came from: the JSON file given, else `pulumi stack output`."""
    if path is not None:
        return load_outputs(path), str(path)
    command = ["pulumi", "stack", "output", "--json", "--stack", stack]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise DlinfraError(
            f"the pulumi CLI is not installed: pass --outputs FILE (the JSON of `{' '.join(command)}`) or --group NAME"
        ) from None
    if done.returncode != 0:
        raise DlinfraError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise DlinfraError(f"`{' '.join(command)}` printed no JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise DlinfraError(f"`{' '.join(command)}` printed no JSON object")
    return data, f"pulumi stack output --stack {stack}"
