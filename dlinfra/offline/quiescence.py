"""Running a Pulumi program under mocks at the speed of its registrations: waiting for it to settle in one pass
per batch of outstanding outputs, and collecting garbage rarely while it runs.

Before a program ends, the Python SDK (`pulumi.runtime.stack.wait_for_rpcs`) waits for its outstanding RPCs and
then for every outstanding output task. Since pulumi/pulumi#22411 (3.2xx) it does the latter with
`asyncio.wait(pending, return_when=FIRST_COMPLETED)` and puts the rest back: with N outputs settling one after
another, that registers and removes a done-callback on every pending task N times, O(N^2). Under mocks, where
nothing waits on a cloud, that was 27% of a preview of the reference fleet.

`wait_for_rpcs` below is the same loop with `FIRST_EXCEPTION`: it returns when the whole batch is done, or as soon
as one task fails, so a failure still surfaces at once and with its own traceback. Tasks that outputs start while
it waits are picked up by the next pass, as in the SDK. `settled_in_batches` installs it for one run only.

`few_collections` keeps the cyclic garbage collector from rescanning the whole heap again and again while a
program runs: every output, task and callback the SDK makes is a new container object, so with the default
threshold (700) a generation-0 collection ran every few dozen resources and the older generations often enough
that collection took about a third of a warm stack's run. Objects alive before the run (imported modules, the
fleet) are frozen out of collection, and generation 0 is collected every 100,000 new objects; everything is
collected as usual after the run.

`without_source_positions` skips the stack trace the SDK takes for every resource (`traceback.extract_stack`,
reading each frame's source line) so that the CLI can show where a resource was declared: the offline engine's
monitor never reads it, and with components several frames deep it was a tenth of a preview.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

from pulumi.runtime import resource, settings, stack
from pulumi.runtime.proto import source_pb2


async def wait_for_rpcs(await_all_outstanding_tasks: bool = True) -> None:
    """Wait until no RPC and (by default) no output task is outstanding; re-raise the first failure."""
    rpc_manager = settings._get_rpc_manager()  # noqa: SLF001 - the SDK's loop, reproduced
    while True:
        while rpc_manager.rpcs:
            await asyncio.sleep(0)  # let the RPCs just queued run, as the SDK does
            try:
                await rpc_manager.rpcs.pop()
            except Exception as exn:
                if rpc_manager.unhandled_exception is not None:
                    raise exn from rpc_manager.unhandled_exception.with_traceback(rpc_manager.exception_traceback)
                raise
        if rpc_manager.unhandled_exception is not None:
            raise rpc_manager.unhandled_exception.with_traceback(rpc_manager.exception_traceback)
        if await_all_outstanding_tasks:
            await _drain_outputs()
        if not rpc_manager.rpcs:
            return


async def _drain_outputs() -> None:
    outputs = settings.SETTINGS
    while True:
        with outputs.lock:
            if not outputs.outputs:
                return
            pending = list(outputs.outputs)
            outputs.outputs.clear()
        done, not_done = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            await task  # re-raises the task's own exception
        if not_done:
            with outputs.lock:
                outputs.outputs.update(not_done)


@contextlib.contextmanager
def settled_in_batches() -> Iterator[None]:
    """Use `wait_for_rpcs` above for programs run inside this block, and the SDK's own again after it."""
    original = stack.wait_for_rpcs
    stack.wait_for_rpcs = wait_for_rpcs
    try:
        yield
    finally:
        stack.wait_for_rpcs = original


GEN0_THRESHOLD = 100_000  # new container objects between generation-0 collections while a program runs


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Everything alive now out of garbage collection for the block: what a forked worker inherits is then never
    scanned (or, by being scanned, copied) by its collections."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Freeze what is alive now out of garbage collection and collect rarely, for the duration of the block."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], GEN0_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _no_stack_trace() -> source_pb2.StackTrace:
    return source_pb2.StackTrace()


@contextlib.contextmanager
def without_source_positions() -> Iterator[None]:
    """Register resources without the declaring stack trace for the duration of the block."""
    original = resource._get_stack_trace  # noqa: SLF001 - the SDK's per-resource stack trace
    resource._get_stack_trace = _no_stack_trace  # noqa: SLF001
    try:
        yield
    finally:
        resource._get_stack_trace = original  # noqa: SLF001
