"""The offline engine: runs the real stack program in-process under Pulumi's mocks, one stack at a time.

Each stack runs in a fresh context (Pulumi's settings and config are context variables), in dependency
order, so a global stack's StackReferences resolve to the regional stacks' real offline exports.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import runpy
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pulumi.runtime import config as pulumi_config
from pulumi.runtime import mocks, settings, stack

from dlinfra.errors import DlinfraError
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import quiescence
from dlinfra.offline.cache import StackCache
from dlinfra.offline.cloud import FakeCloud
from dlinfra.offline.monitor import RecordingMonitor
from dlinfra.offline.plan_export import StackResult

ORGANIZATION = "organization"


class EngineError(DlinfraError):
    """The program failed under the offline engine (bad input, unknown key, unknown invoke)."""


def disabled_default_providers(root: Path) -> frozenset[str]:
    """Packages whose default providers the project disables (`pulumi:disable-default-providers` in Pulumi.yaml)."""
    path = root / "Pulumi.yaml"
    project = yaml.safe_load(path.read_text()) if path.exists() else {}
    setting = ((project or {}).get("config") or {}).get("pulumi:disable-default-providers")
    value = setting.get("value") if isinstance(setting, dict) else setting
    return frozenset(str(p) for p in value or ())


def stack_config(root: Path, stack_name: str) -> dict[str, Any]:
    """The `config:` of stacks/Pulumi.<stack>.yaml, flattened to `ns:key` -> value (secure values masked)."""
    path = root / "stacks" / f"Pulumi.{stack_name}.yaml"
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    out: dict[str, Any] = {}
    for key, value in (data.get("config") or {}).items():
        if isinstance(value, dict) and "secure" in value:
            value = "offline-placeholder-secret"  # ciphertext cannot be decrypted without the Pulumi CLI
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out


def run_stack(
    root: Path,
    role: StackRole,
    *,
    project: str,
    config: Mapping[str, str],
    stack_exports: Mapping[str, Mapping[str, Any]],
    program: Path | None = None,
) -> StackResult:
    """Run the stack program for one stack under the fake cloud; EngineError on any failure."""
    result = StackResult(role=role)
    no_defaults = disabled_default_providers(root)
    # With the default AWS provider disabled there is no default region: every AWS resource and invoke must
    # reach the fake cloud through an explicit provider, which names its region.
    cloud = FakeCloud(region=None if "aws" in no_defaults else role.region, stack_exports=stack_exports)
    monitor = RecordingMonitor(cloud, result, no_defaults)
    entry = program or root / "stacks" / "__main__.py"
    started = time.perf_counter()

    def body() -> None:
        cfg = {**stack_config(root, role.name), **config}
        try:
            under_mocks(
                monitor, lambda: _run_program(entry), root=root, project=project, stack_name=role.name, config=cfg
            )
        finally:
            monitor.close()

    try:
        contextvars.Context().run(body)
    except DlinfraError as exc:
        raise EngineError(exc.detail, file=exc.file, key=exc.key) from None
    except Exception as exc:  # noqa: BLE001 - any program failure becomes one clear message
        detail = "; ".join(monitor.errors) or describe_failure(exc)
        raise EngineError(f"stack {role.name}: {detail}") from None
    result.seconds = time.perf_counter() - started
    return result


def under_mocks(
    monitor: mocks.MockMonitor,
    program: Callable[[], None],
    *,
    root: Path,
    project: str,
    stack_name: str,
    config: Mapping[str, str],
) -> None:
    """Run a Pulumi program as a preview against a mock monitor, in the calling context (give it a fresh one)."""
    settings.configure(
        mocks.MockSettings(
            monitor=monitor,
            monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
            engine=mocks.MockEngine(None),
            project=project,
            stack=stack_name,
            dry_run=True,
            organization=ORGANIZATION,
            root_directory=str(root),
            callbacks=None,
            # MockSettings skips Settings.__init__, so these would fall back to one default shared by every
            # context: a failed run's pending tasks would then leak into the next stack's run.
            outputs=set(),
            lock=threading.Lock(),
            package_refs={},
            base_providers_by_ref={},
        )
    )
    settings.ROOT.set(None)
    pulumi_config.set_all_config(dict(config), [])
    with (
        quiescence.settled_in_batches(),
        quiescence.few_collections(),
        quiescence.without_source_positions(),
        asyncio.Runner() as runner,
    ):
        runner.get_loop().set_exception_handler(_record_loop_error)
        runner.run(stack.run_in_stack(program))


def _record_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Keep the event loop's own error reports quiet: a failed stack is reported once, as an EngineError.

    The default handler also formats a traceback, which on CPython 3.11 calls ast.parse; run from a future's
    finaliser inside another ast.parse, that makes CPython raise "AST constructor recursion depth mismatch".
    """
    del loop, context


def _run_program(entry: Path) -> None:
    runpy.run_path(str(entry), run_name="__main__")


def describe_failure(exc: BaseException) -> str:
    """The innermost useful message of a program failure (Pulumi wraps errors raised in callbacks)."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    innermost = chain[-1]
    if isinstance(innermost, DlinfraError):
        return str(innermost)
    # The SDK's own type checks say which resource and input they were on in an outer link of the chain.
    context = next((str(e).splitlines()[0] for e in chain if str(e).startswith("While processing resource")), "")
    return "; ".join(p for p in (context, f"{type(innermost).__name__}: {innermost}") if p)


def run_all(
    root: Path,
    roles: Iterable[StackRole],
    *,
    project: str,
    config: Mapping[str, str],
    on_done: Callable[[StackResult], None] | None = None,
    program: Path | None = None,
    cache: StackCache | None = None,
) -> list[StackResult]:
    """Run stacks in the given (dependency) order, feeding each one's exports to later StackReferences; with a
    cache, a stack whose key is stored is reused instead of run (dlinfra.offline.cache)."""
    exports: dict[str, dict[str, Any]] = {}
    results = []
    for role in roles:
        key = cache.key(role, exports) if cache is not None else ""
        res = cache.load(role, key) if cache is not None else None
        if res is None:
            res = run_stack(root, role, project=project, config=config, stack_exports=exports, program=program)
            if cache is not None:
                cache.store(role, key, res)
        exports[role.name] = res.exports()
        results.append(res)
        if on_done:
            on_done(res)
    return results
