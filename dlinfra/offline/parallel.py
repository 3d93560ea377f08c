"""Offline runs in worker processes, each stack once the stacks it reads are done; provider SDKs preloaded."""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

from pulumi.runtime import rpc

from dlinfra.model.stackroles import StackRole
from dlinfra.offline import quiescence
from dlinfra.offline.engine import EngineError, describe_failure, run_stack
from dlinfra.offline.plan_export import StackResult

# The provider SDK packages of the resource types dlinfra declares (every one is in dlinfra/data/replacements.yaml,
# which tests/model/test_replacement.py checks against the code).
_SDK_PACKAGES = {"aws": "pulumi_aws", "kubernetes": "pulumi_kubernetes", "random": "pulumi_random", "tls": "pulumi_tls"}


def sdk_class(token: str) -> type[Any] | None:
    """The provider SDK class that declares a resource type (pulumi_aws.ec2.Vpc for aws:ec2/vpc:Vpc), found through
    the SDK's own resource-module registry; None for a type no installed provider SDK declares."""
    package, module, _ = token.split(":")
    if package not in _SDK_PACKAGES:
        return None
    importlib.import_module(_SDK_PACKAGES[package])  # registers its resource modules
    registered = rpc.get_resource_module(package, module, "")
    if registered is None:
        return None
    info = registered.mod_info  # type: ignore[attr-defined]
    return getattr(importlib.import_module(info["fqn"]), info["classes"][token], None)  # type: ignore[no-any-return]


def preload_sdk_modules() -> list[str]:
    """Import the provider SDK modules that declare dlinfra's resource types; returns their names.

    The provider SDKs import their modules lazily, on first use, and a module such as pulumi_aws.ec2 takes about a
    second: done before forking, the worker processes share it instead of each importing it again. The modules are
    those of the types in the replacement table.
    """
    from dlinfra.model import replacement

    classes = (sdk_class(token) for token in replacement.table().rules)
    return sorted({cls.__module__.rpartition(".")[0] for cls in classes if cls is not None})


def run_parallel(
    root: Path,
    roles: Sequence[StackRole],
    depends_on: Mapping[StackRole, Sequence[StackRole]],
    *,
    project: str,
    config: Mapping[str, str],
    jobs: int,
    on_done: Callable[[StackResult], None] | None = None,
    program: Path | None = None,
) -> list[StackResult]:
    """Run stacks in up to `jobs` processes, each as soon as the stacks it reads are done; same results as run_all.

    Pulumi's mock runtime is per-process state, so a process runs one stack at a time. A stack gets the exports
    of the stacks it depends on only, so a reference the dependencies do not declare fails the same in every
    order. Results are reported in the order of `roles`, whatever order they finish in. When a stack fails, the
    stacks that depend on it are not run, and EngineError names both.
    """
    order = list(roles)
    selected = set(order)
    needs = {role: [d for d in depends_on.get(role, ()) if d in selected] for role in order}
    exports: dict[str, dict[str, Any]] = {}
    done: dict[StackRole, StackResult] = {}
    failed: dict[StackRole, str] = {}
    blocked: dict[StackRole, StackRole] = {}  # stack not run -> the failed stack it (transitively) depends on
    reported = 0
    # fork: the workers start with dlinfra, pulumi and the provider SDK modules the programs use already imported
    # (imported once here, not once per worker), and everything alive frozen out of garbage collection, so the
    # workers neither rescan nor copy it. The parent runs no Pulumi program here, so no mock runtime state or
    # engine thread is copied into them.
    preload_sdk_modules()
    with quiescence.frozen(), futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        running: dict[futures.Future[StackResult], StackRole] = {}
        waiting = list(order)

        def submit_ready() -> None:
            for role in list(waiting):
                cause = next((blocked.get(d, d) for d in needs[role] if d in failed or d in blocked), None)
                if cause is not None:
                    blocked[role] = cause
                    waiting.remove(role)
                elif all(d in done for d in needs[role]):
                    refs = {d.name: exports[d.name] for d in needs[role]}
                    waiting.remove(role)
                    try:
                        job = pool.submit(
                            run_stack,
                            root,
                            role,
                            project=project,
                            config=dict(config),
                            stack_exports=refs,
                            program=program,
                        )
                    except futures.process.BrokenProcessPool as exc:  # a worker died (killed, out of memory)
                        failed[role] = f"stack {role.name}: not run, the worker processes stopped ({exc})"
                        continue
                    running[job] = role

        submit_ready()
        while running:
            finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in sorted(finished, key=lambda f: order.index(running[f])):
                role = running.pop(future)
                try:
                    res = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker's failure (or its death) is that stack's failure
                    message = str(exc) if isinstance(exc, EngineError) else describe_failure(exc)
                    failed[role] = (
                        message if message.startswith(f"stack {role.name}:") else f"stack {role.name}: {message}"
                    )
                    continue
                exports[role.name] = {"outputs": res.outputs, "secret": sorted(res.secret_outputs)}
                done[role] = res
            submit_ready()
            while reported < len(order) and order[reported] in done.keys() | failed.keys() | blocked.keys():
                if on_done and order[reported] in done:
                    on_done(done[order[reported]])
                reported += 1
    if failed:
        messages = []
        for role, message in failed.items():
            dependents = [r.name for r in order if blocked.get(r) == role]
            if dependents:
                message += f" (not previewed, as they depend on {role.name}: {', '.join(dependents)})"
            messages.append(message)
        raise EngineError("; ".join(messages))
    return [done[role] for role in order]
