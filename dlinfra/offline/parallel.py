"""Offline runs in worker processes, each stack once the stacks it reads are done; provider SDKs preloaded."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import io
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
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
        # One stack to run and what waits on it (a change to one environment, the rest reused): a pool of worker
        # processes would cost more to start than it saves, so they run here, one after another; but for the
        # stacks that wait on it alone, a forked process each, started at once on a guess of its exports.
        run.here(first, root=root, project=project, config=config, program=program, jobs=jobs)
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
        self.exports[role.name] = res.exports()
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
        jobs: int,
    ) -> None:
        """Run stacks in this process until none is left: `batch`, then what becomes ready as they finish; with
        jobs > 1, the stacks that wait on a lone first stack alone also run meanwhile (speculate)."""
        run = functools.partial(run_stack, root, project=project, config=dict(config), program=program)
        guessed: dict[StackRole, _Speculation] = {}
        try:
            try:
                guessed = self.speculate(batch, run, slots=jobs - 1, into=guessed)
            except Exception:  # noqa: BLE001 - a guess is optional: without it (no fork, no readable exports) runs go on
                for speculation in guessed.values():
                    speculation.stop()
                guessed = {}
            while batch:
                for role, refs in batch:  # a wrong guess is stopped first, to free its processor for the real run
                    if role in guessed and not _same(guessed[role].refs, refs):
                        guessed.pop(role).stop()
                outcomes: dict[StackRole, StackResult | EngineError] = {}
                # Those started on a guess are collected last: they have been running meanwhile.
                for role, refs in sorted(batch, key=lambda item: item[0] in guessed):
                    res = guessed.pop(role).result() if role in guessed else None
                    try:
                        outcomes[role] = res if res is not None else run(role, stack_exports=refs)
                    except EngineError as exc:
                        outcomes[role] = exc
                for role, _ in batch:
                    outcome = outcomes[role]
                    if isinstance(outcome, EngineError):
                        self.fail(role, outcome)
                    else:
                        self.ran(role, outcome)
                batch = self.ready()
                self.report()
        finally:
            for speculation in guessed.values():
                speculation.stop()

    def speculate(
        self,
        batch: list[tuple[StackRole, dict[str, Any]]],
        run: Callable[..., StackResult],
        *,
        slots: int,
        into: dict[StackRole, _Speculation],
    ) -> dict[StackRole, _Speculation]:
        """Start, in up to `slots` forked processes, the stacks that wait on the lone stack of `batch` alone, with
        the exports it gave the last time it ran (the plan cache keeps them): when it gives the same again, they are
        done by then. Not a stack whose guessed key is stored: the cache will serve that one."""
        if slots < 1 or len(batch) != 1 or self.cache is None:
            return {}
        lone = batch[0][0]
        guess = self.cache.last_exports(lone)
        if guess is None:
            return {}
        exports = {**self.exports, lone.name: guess}
        started = into  # filled as they start, so that the caller stops them whatever happens next
        with quiescence.frozen():  # see in_workers
            for role in self.waiting:
                needs = self.needs[role]
                if len(started) == slots or lone not in needs or not all(d in self.done or d == lone for d in needs):
                    continue
                refs = {d.name: exports[d.name] for d in needs}
                if not self.cache.stored(role, self.cache.key(role, refs)):
                    started[role] = _Speculation.start(functools.partial(run, role, stack_exports=refs), refs)
        return started

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
        with (
            quiescence.frozen(),
            futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=die_with_parent) as pool,
        ):
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


@dataclass
class _Speculation:
    """A stack running in a forked process on guessed exports of the stacks it reads (`refs`). Its result counts
    only when the exports it read turn out to be exactly the real ones: a stack program is deterministic, so it is
    then the result a run would give. Its failure never counts: the stack then runs again, and that run says."""

    refs: dict[str, Any]
    process: multiprocessing.process.BaseProcess
    reader: Connection

    @classmethod
    def start(cls, run: Callable[[], StackResult], refs: dict[str, Any]) -> _Speculation:
        # fork: the process starts with everything this one imported, and runs one program; nothing to set up.
        context = multiprocessing.get_context("fork")
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(target=_speculate, args=(run, writer, reader), daemon=True)
        process.start()
        writer.close()
        return cls(refs=refs, process=process, reader=reader)

    def result(self) -> StackResult | None:
        """Its result, when it is done, and what it printed (a stack program's warnings) printed here, where the run
        it stands for would have printed it; None when it failed or its process died, and then nothing is shown."""
        try:
            payload = self.reader.recv_bytes()
            result, out, err = pickle.loads(payload) if payload else (None, "", "")
        except Exception:  # noqa: BLE001 - whatever went wrong, the stack runs again
            return None
        finally:
            self.stop()
        if not isinstance(result, StackResult):
            return None
        sys.stdout.write(out)
        sys.stderr.write(err)
        return result

    def stop(self) -> None:
        """End the process, done or not."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.reader.close()


def _speculate(run: Callable[[], StackResult], writer: Connection, reader: Connection) -> None:
    """A speculation's process: its result and what it printed, pickled to the pipe; nothing when it fails. It
    holds no read end of its pipe (a write nobody reads then fails instead of waiting), and dies with its parent."""
    reader.close()
    die_with_parent()
    # What it prints is kept with its result, shown only if the result is (new streams also hold none of the locks
    # another thread of the parent may have held on the old ones when it forked).
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        result = run()
        result.plan_text()  # serialized here, meanwhile, instead of in the parent after it
        payload = pickle.dumps((result, out.getvalue(), err.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - not reported: the stack runs again, and that run says what is wrong
        payload = b""
    writer.send_bytes(payload)
    writer.close()


def _same(guess: Any, real: Any) -> bool:
    """Whether guessed exports are exactly the real ones: JSON-like data of the same types all the way down (1 is
    neither 1.0 nor True) and mappings in the same order; anything else (an asset, an unknown) never is."""
    if type(guess) is not type(real):
        return False
    if isinstance(guess, dict):
        return list(guess) == list(real) and all(_same(guess[k], real[k]) for k in guess)
    if isinstance(guess, (list, tuple)):
        return len(guess) == len(real) and all(_same(g, r) for g, r in zip(guess, real, strict=True))
    if isinstance(guess, float):
        return repr(guess) == repr(real)  # -0.0 is not 0.0 (json writes them differently), and nan is never equal
    return isinstance(guess, (str, int, bool, type(None))) and bool(guess == real)


def die_with_parent() -> None:
    """Have the kernel kill this process when the process that forked it dies, however it dies (Linux; elsewhere
    nothing): a worker or a speculation is then never left behind by a preview killed mid-run."""
    with contextlib.suppress(OSError, AttributeError):
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before the request took effect
            os._exit(1)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
