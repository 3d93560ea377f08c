"""CrdWait: waits until every named CRD is Established, then creates; names the missing ones when it gives up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from components import crd_wait

ESTABLISHED = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                         {"type": "Established", "status": "True"}]}}  # fmt: skip
PENDING = {"status": {"conditions": [{"type": "Established", "status": "False"}]}}


class FakeCluster:
    """CRDs that appear after some reads, as an operator registering them at start would make them."""

    def __init__(self, timeline: Mapping[str, list[Mapping[str, Any] | None]]) -> None:
        self.timeline = {name: list(states) for name, states in timeline.items()}
        self.reads = 0

    def read(self, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        states = self.timeline.get(name, [None])
        return states.pop(0) if len(states) > 1 else states[0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_until_every_crd_is_established() -> None:
    cluster = FakeCluster({"a.cilium.io": [None, PENDING, ESTABLISHED], "b.cilium.io": [None, ESTABLISHED]})
    clock = Clock()
    crd_wait.wait_established(cluster.read, ["a.cilium.io", "b.cilium.io"], clock=clock, sleep=clock.sleep)
    assert clock.now == 2 * crd_wait.POLL_SECONDS  # two rounds of waiting, then both served


def test_gives_up_naming_the_missing_crds() -> None:
    cluster = FakeCluster({"a.cilium.io": [ESTABLISHED], "b.cilium.io": [None]})
    clock = Clock()
    with pytest.raises(TimeoutError, match=r"after 60s: b\.cilium\.io \(does their operator run"):
        crd_wait.wait_established(
            cluster.read, ["a.cilium.io", "b.cilium.io"], timeout_s=60, clock=clock, sleep=clock.sleep
        )
    assert clock.now >= 60


@pytest.mark.parametrize(
    ("crd", "served"),
    [(None, False), ({}, False), ({"status": None}, False), (PENDING, False), (ESTABLISHED, True)],
)
def test_established_reads_the_condition(crd: Mapping[str, Any] | None, served: bool) -> None:
    assert crd_wait.established(crd) is served


def test_the_provider_creates_only_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster({"a.cilium.io": [None, ESTABLISHED]})
    seen: list[str] = []

    def reader(kubeconfig: str) -> crd_wait.ReadCrd:
        seen.append(kubeconfig)
        return cluster.read

    monkeypatch.setattr(crd_wait, "_reader", reader)
    provider = crd_wait.CrdWaitProvider()
    clock = Clock()
    provider.clock, provider.sleep = clock, clock.sleep  # type: ignore[method-assign]
    result = provider.create({"kubeconfig": "{}", "crds": ["a.cilium.io"]})
    assert seen == ["{}"] and cluster.reads == 2 and result.outs["crds"] == ["a.cilium.io"]
    monkeypatch.setattr(crd_wait, "_reader", lambda _k: FakeCluster({}).read)
    with pytest.raises(TimeoutError, match=r"b\.cilium\.io"):
        provider.update("id", {}, {"kubeconfig": "{}", "crds": ["b.cilium.io"]})
    assert clock.now >= crd_wait.WAIT_SECONDS
