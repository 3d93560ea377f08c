"""The offline engine's run harness: outputs settle in batches, failures still surface, the SDK is left as found."""

from __future__ import annotations

import asyncio
import contextvars
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import mocks, resource, stack

from dlinfra.offline import engine, quiescence


class _Echo(mocks.Mocks):
    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


def _run(program: Callable[[], None]) -> None:
    contextvars.Context().run(
        engine.under_mocks,
        mocks.MockMonitor(_Echo()),
        program,
        root=Path.cwd(),
        project="dlinfra",
        stack_name="test",
        config={},
    )


def _many_outputs(count: int, seen: list[int], fail_at: int | None = None) -> Callable[[], None]:
    def check(i: int) -> int:
        if i == fail_at:
            raise ValueError(f"output {i} failed")
        seen.append(i)
        return i

    def program() -> None:
        # A chain, as in a stack: each resource takes the previous one's output, so outputs settle one by one.
        previous: pulumi.Output[Any] = pulumi.Output.from_input(0)
        for i in range(count):
            resource = pulumi.CustomResource("test:index:Thing", f"thing-{i}", {"after": previous})
            previous = resource.id.apply(lambda _, i=i: check(i))

    return program


def test_outputs_settle_in_a_few_waits_not_one_per_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK's own loop waits once per settled output (FIRST_COMPLETED), re-arming every pending one each time:
    # quadratic. The engine's waits once per batch.
    waits: list[int] = []
    real_wait = asyncio.wait

    async def counting_wait(tasks: Any, **kwargs: Any) -> Any:
        waits.append(len(tasks))
        return await real_wait(tasks, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counting_wait)
    seen: list[int] = []
    _run(_many_outputs(300, seen))
    assert sorted(seen) == list(range(300))
    # Measured: the engine 1 wait arming 902 tasks; the SDK's loop 306 waits arming 140,864.
    assert 0 < len(waits) <= 5 and sum(waits) <= 10 * 300, (len(waits), sum(waits))


def test_a_failing_output_still_fails_the_run() -> None:
    with pytest.raises(ValueError, match="output 150 failed"):
        _run(_many_outputs(300, [], fail_at=150))


def test_the_sdk_wait_and_the_collector_are_restored_after_a_run() -> None:
    threshold = gc.get_threshold()
    during: list[Any] = []

    def program() -> None:
        traced = len(resource._get_stack_trace().frames)
        during.append((stack.wait_for_rpcs, gc.get_threshold()[0], gc.get_freeze_count() > 0, traced))

    original, trace = stack.wait_for_rpcs, resource._get_stack_trace
    _run(program)
    assert during == [(quiescence.wait_for_rpcs, quiescence.GEN0_THRESHOLD, True, 0)]
    assert stack.wait_for_rpcs is original and resource._get_stack_trace is trace
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0

    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(Exception, match="boom"):
        _run(failing)
    assert stack.wait_for_rpcs is original and resource._get_stack_trace is trace
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0
