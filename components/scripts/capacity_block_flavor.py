"""Keeps each Capacity Block's Kueue flavor closed outside the block's window (components/block_flavors.py).

Kueue has no time-boxed quota, but a ResourceFlavor's nodeTaints decide which workloads the flavor may take: the
flavor assigner skips a flavor whose NoSchedule or NoExecute taint a pod set does not tolerate and tries the next one
(pkg/scheduler/flavorassigner/flavorassigner.go, v0.19.2), and an edit of a flavor's nodeTaints makes Kueue retry the
workloads it had left inadmissible (pkg/controller/core/resourceflavor_controller.go, Update). So outside the window
this keeper adds CLOSED_TAINT, which no job tolerates: a job submitted before the block starts goes to the next
flavor instead of waiting for nodes that cannot exist yet, and a job requeued after the block's drain goes elsewhere
(or overflows) instead of being given the ended block again. Inside the window the flavor carries only the pool's own
taints.

Level-triggered, like the block's group keeper (components/lambdas/capacity_block_window.py): every minute (a
CronJob) it computes each flavor's taints from the clock and applies them by server-side apply as its own field
manager, which owns spec.nodeTaints of these flavors alone (the program declares them without). It runs in the
stock Python image with the standard library only, so nothing is installed at run time; its Kubernetes calls are
one PATCH per flavor with the pod's service account token (Kubernetes docs "Server-Side Apply"; the client is
kube_api, shipped beside it).
"""

from __future__ import annotations

import datetime
import json
import sys
import urllib.error
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from components.scripts import kube_api

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
CLOSED_TAINT = {"key": "dlinfra.io/capacity-block-closed", "value": "true", "effect": "NoSchedule"}
FIELD_MANAGER = "dlinfra-capacity-block-window"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
SERVICE_ACCOUNT = kube_api.SERVICE_ACCOUNT
TIMEOUT_SECONDS = kube_api.TIMEOUT_SECONDS  # one PATCH; the CronJob runs every minute, its Job cut before the next


@dataclass(frozen=True)
class FlavorWindow:
    """One block's flavor: when it admits work, and the pool's own taints it always carries."""

    flavor: str
    opens_at: datetime.datetime  # the block's start
    closes_at: datetime.datetime  # a little before the block's drain time, when its group closes
    taints: tuple[Mapping[str, str], ...]

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> FlavorWindow:
        return cls(
            flavor=str(entry["flavor"]),
            opens_at=parse_time(str(entry["opens_at"])),
            closes_at=parse_time(str(entry["closes_at"])),
            taints=tuple({k: str(t[k]) for k in ("key", "value", "effect")} for t in entry.get("taints", ())),
        )

    def is_open(self, now: datetime.datetime) -> bool:
        return self.opens_at <= now < self.closes_at

    def taints_at(self, now: datetime.datetime) -> list[dict[str, str]]:
        """The flavor's nodeTaints now: the pool's, plus CLOSED_TAINT outside the window."""
        return [dict(t) for t in self.taints] + ([] if self.is_open(now) else [dict(CLOSED_TAINT)])

    def state(self, now: datetime.datetime) -> str:
        if self.is_open(now):
            return f"open until {self.closes_at.strftime(TIME_FORMAT)}"
        if now < self.opens_at:
            return f"closed until {self.opens_at.strftime(TIME_FORMAT)}"
        return f"closed since {self.closes_at.strftime(TIME_FORMAT)} (the block is draining or over)"


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def load(text: str) -> list[FlavorWindow]:
    """The keeper's configuration (components/block_flavors.keeper_config): {"flavors": [...]}."""
    return [FlavorWindow.from_config(entry) for entry in json.loads(text)["flavors"]]


def apply_body(window: FlavorWindow, now: datetime.datetime) -> dict[str, Any]:
    """The server-side apply configuration: the one field this keeper owns."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": window.flavor},
        "spec": {"nodeTaints": window.taints_at(now)},
    }


class Cluster(Protocol):
    def apply(self, name: str, body: Mapping[str, Any]) -> None: ...


class ApiServer(kube_api.ApiServer):
    """The API server, with the one call this keeper makes."""

    def apply(self, name: str, body: Mapping[str, Any]) -> None:
        # Force: the field is this keeper's alone; a hand edit of the taints is put back.
        self.request(
            "PATCH",
            f"/apis/{KUEUE_API}/resourceflavors/{urllib.parse.quote(name, safe='')}",
            body,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )


class KeeperError(Exception):
    """Some flavor could not be set: every flavor's line, the failures among them."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def run(windows: Sequence[FlavorWindow], cluster: Cluster, now: datetime.datetime) -> list[str]:
    """Apply every flavor's taints; one line per flavor, and every flavor tried even if one fails."""
    lines, failed = [], []
    for window in windows:
        try:
            cluster.apply(window.flavor, apply_body(window, now))
        except (OSError, urllib.error.URLError) as exc:  # HTTPError is a URLError: 403, 404, 409...
            detail = exc.read().decode(errors="replace")[:500] if isinstance(exc, urllib.error.HTTPError) else ""
            failed.append(window.flavor)
            lines.append(f"flavor {window.flavor}: not applied: {exc} {detail}".rstrip())
            continue
        lines.append(f"flavor {window.flavor}: {window.state(now)}")
    if failed:
        raise KeeperError(lines)
    return lines


def main(argv: Sequence[str]) -> int:
    """python3 capacity_block_flavor.py CONFIG: exit 1 when a flavor could not be set (the Job shows Failed)."""
    with open(argv[1], encoding="utf-8") as config:
        windows = load(config.read())
    try:
        lines = run(windows, ApiServer.in_cluster(), datetime.datetime.now(datetime.UTC))
    except KeeperError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
