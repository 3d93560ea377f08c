"""Offline runs in worker processes, each stack once the stacks it reads are done; provider SDKs preloaded."""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi.runtime import rpc

from dlinfra.model.stackroles import StackRole
from dlinfra.offline import quiescence
from dlinfra.offline.cache import StackCache
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
    cache: StackCache | None = None,
) -> list[StackResult]:
    """Run stacks in up to `jobs` processes, each as soon as the stacks it reads are done; same results as run_all.
    With a cache, a stack whose key is stored is reused instead of run (dlinfra.offline.cache), and no worker
    process starts when every stack is reused.

    Pulumi's mock runtime is per-process state, so a process runs one stack at a time. A stack gets the exports
    of the stacks it depends on only, so a reference the dependencies do not declare fails the same in every
    order. Results are reported in the order of `roles`, whatever order they finish in. When a stack fails, the
    stacks that depend on it are not run, and EngineError names both.
    """
    order = list(roles)
    selected = set(order)
    run = _Schedule(
        order=order,
        needs={role: [d for d in depends_on.get(role, ()) if d in selected] for role in order},
        cache=cache,
        on_done=on_done,
    )
    first = run.ready()
    run.report()
    if len(first) == 1:
        # One stack to run and what waits on it (a change to one environment, the rest reused): worker processes
        # would cost more to start than they save, so they run here, one after another.
        run.here(first, root=root, project=project, config=config, program=program)
    elif first:
        run.in_workers(first, root=root, project=project, config=config, jobs=jobs, program=program)
    if run.failed:
        messages = []
        for role, message in run.failed.items():
            dependents = [r.name for r in order if run.blocked.get(r) == role]
            if dependents:
                message += f" (not previewed, as they depend on {role.name}: {', '.join(dependents)})"
            messages.append(message)
        raise EngineError("; ".join(messages))
    return [run.done[role] for role in order]


@dataclass
class _Schedule:
    """One parallel run's state: what is done, failed, blocked and waiting, and what was reported."""

    order: list[StackRole]
    needs: Mapping[StackRole, list[StackRole]]
    cache: StackCache | None
    on_done: Callable[[StackResult], None] | None
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: dict[StackRole, StackResult] = field(default_factory=dict)
    failed: dict[StackRole, str] = field(default_factory=dict)
    blocked: dict[StackRole, StackRole] = field(default_factory=dict)  # not run -> the failed stack it depends on
    keys: dict[StackRole, str] = field(default_factory=dict)
    waiting: list[StackRole] = field(default_factory=list)
    reported: int = 0

    def __post_init__(self) -> None:
        self.waiting = list(self.order)

    def fail(self, role: StackRole, exc: BaseException) -> None:
        """A stack's failure, as one message that starts with its name."""
        message = str(exc) if isinstance(exc, EngineError) else describe_failure(exc)
        prefix = f"stack {role.name}:"
        self.failed[role] = message if message.startswith(prefix) else f"{prefix} {message}"

    def ran(self, role: StackRole, res: StackResult) -> None:
        """A stack that ran: kept in the cache under its key, and done."""
        if self.cache is not None:
            self.cache.store(role, self.keys[role], res)
        self.finish(role, res)

    def finish(self, role: StackRole, res: StackResult) -> None:
        self.exports[role.name] = {"outputs": res.outputs, "secret": sorted(res.secret_outputs)}
        self.done[role] = res

    def ready(self) -> list[tuple[StackRole, dict[str, Any]]]:
        """Take the waiting stacks whose dependencies are done, reusing cached ones (and what they unblock);
        returns those left to run, with the exports they read."""
        to_run = []
        progress = True
        while progress:
            progress = False
            for role in list(self.waiting):
                cause = next(
                    (self.blocked.get(d, d) for d in self.needs[role] if d in self.failed or d in self.blocked), None
                )
                if cause is not None:
                    self.blocked[role] = cause
                    self.waiting.remove(role)
                elif all(d in self.done for d in self.needs[role]):
                    refs = {d.name: self.exports[d.name] for d in self.needs[role]}
                    self.waiting.remove(role)
                    hit = None
                    if self.cache is not None:
                        self.keys[role] = self.cache.key(role, refs)
                        hit = self.cache.load(role, self.keys[role])
                    if hit is None:
                        to_run.append((role, refs))
                    else:
                        self.finish(role, hit)
                        progress = True  # what waited on this stack may be ready now
        return to_run

    def report(self) -> None:
        """Report the results that are in, in the order of the roles."""
        over = self.done.keys() | self.failed.keys() | self.blocked.keys()
        while self.reported < len(self.order) and self.order[self.reported] in over:
            if self.on_done and self.order[self.reported] in self.done:
                self.on_done(self.done[self.order[self.reported]])
            self.reported += 1

    def here(
        self,
        batch: list[tuple[StackRole, dict[str, Any]]],
        *,
        root: Path,
        project: str,
        config: Mapping[str, str],
        program: Path | None,
    ) -> None:
        """Run stacks in this process until none is left: `batch`, then what becomes ready as they finish."""
        while batch:
            for role, refs in batch:
                try:
                    res = run_stack(
                        root, role, project=project, config=dict(config), stack_exports=refs, program=program
                    )
                except EngineError as exc:
                    self.fail(role, exc)
                    continue
                self.ran(role, res)
            batch = self.ready()
            self.report()

    def in_workers(
        self,
        first: list[tuple[StackRole, dict[str, Any]]],
        *,
        root: Path,
        project: str,
        config: Mapping[str, str],
        jobs: int,
        program: Path | None,
    ) -> None:
        """Run stacks in worker processes until none is left: `first`, then what becomes ready as they finish."""
        # fork: the workers start with dlinfra, pulumi and the provider SDK modules the programs use already imported
        # (imported once here, not once per worker), and everything alive frozen out of garbage collection, so the
        # workers neither rescan nor copy it. The parent runs no Pulumi program here, so no mock runtime state or
        # engine thread is copied into them.
        preload_sdk_modules()
        context = multiprocessing.get_context("fork")
        with quiescence.frozen(), futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            running: dict[futures.Future[StackResult], StackRole] = {}

            def submit(batch: list[tuple[StackRole, dict[str, Any]]]) -> None:
                for role, refs in batch:
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
                        self.failed[role] = f"stack {role.name}: not run, the worker processes stopped ({exc})"
                        continue
                    running[job] = role

            submit(first)
            while running:
                finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: self.order.index(running[f])):
                    role = running.pop(future)
                    try:
                        res = future.result()
                    except Exception as exc:  # noqa: BLE001 - a worker's failure (or death) is that stack's failure
                        self.fail(role, exc)
                        continue
                    self.ran(role, res)
                submit(self.ready())
                self.report()
