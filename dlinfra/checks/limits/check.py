"""Each count against its quota's applied value: what approaches or exceeds it, what blocks, and the summary
`dlinfra check` prints and writes (--json, SARIF)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dlinfra.checks.limits import compute, network, services
from dlinfra.checks.limits.scope import Config, Usage, stacks
from dlinfra.model import instances
from dlinfra.model import quotas as quota_data


@dataclass(frozen=True)
class Verdict:
    """A count against the quota's applied value."""

    usage: Usage
    quota: quota_data.Quota
    limit: int
    raised: bool  # the limit is a value the fleet raised it to

    @property
    def share(self) -> float:
        """The count as a share of the limit; a limit of 0 (a quota not raised yet) is full at any count."""
        if not self.limit:
            return math.inf if self.usage.used else 0.0
        return self.usage.used / self.limit

    @property
    def state(self) -> Literal["ok", "near", "over"]:
        if self.usage.used > self.limit:
            return "over"
        return "near" if self.share >= quota_data.NEAR else "ok"

    @property
    def blocking(self) -> bool:
        """Over a quota AWS will not raise: the apply, or the pools at their size, would fail."""
        return self.state == "over" and not self.quota.adjustable

    def message(self) -> str:
        """The count, the quota and what to do about it."""
        u, q = self.usage, self.quota
        verb = "exceeds" if self.state == "over" else "approaches"
        if q.default is None:
            figure = f"capacity {self.limit}"
        elif self.raised:
            figure = f"raised to {self.limit} in the fleet (AWS default {q.default})"
        else:
            figure = f"AWS default {q.default}"
        wanted = max(math.ceil(u.used / quota_data.NEAR), self.limit + 1)
        share = f" ({round(100 * self.share)}%)" if self.limit else ""
        return (
            f"{u.used} of {self.limit}{share} {verb} {q.name} in {u.scope}: {u.how}. {figure}; {q.request_hint(wanted)}"
        )


COUNTS = (
    network.count_per_region,
    network.count_routes,
    network.count_security_group_rules,
    network.count_groups_per_interface,
    network.count_transit_peering,
    network.count_interface_endpoints,
    network.count_client_vpn,
    network.count_network_interfaces,
    compute.count_clusters,
    compute.count_subnet_addresses,
    compute.count_vcpus,
    services.count_lambda_concurrency,
    services.count_build_limits,
    services.count_role_policies,
)


@dataclass(frozen=True)
class Limits:
    """Every count against its quota, and what could not be counted."""

    verdicts: Sequence[Verdict]
    notes: Sequence[str]

    @property
    def reported(self) -> list[Verdict]:
        """The counts that approach or exceed their quota, blocking ones first."""
        hits = [v for v in self.verdicts if v.state != "ok"]
        return sorted(hits, key=lambda v: (not v.blocking, v.state != "over", -v.share, v.quota.key, v.usage.scope))


def usages(plans: Sequence[Mapping[str, Any]], config: Config) -> list[Usage]:
    """Every count the plans give."""
    read = stacks(plans, config)
    return [u for count in COUNTS for u in count(read)]


def analyse(plans: Sequence[Mapping[str, Any]], config: Config) -> Limits:
    """Count the plans and judge each count against its quota's applied value."""
    table = quota_data.table()
    verdicts, notes = [], []
    for u in usages(plans, config):
        quota = table.quotas[u.quota]
        limit, raised = quota_data.applied(quota, u.region, config.raised, config.raised_in)
        limit = limit if limit is not None else u.capacity
        if limit is None or (not limit and quota.default is None):
            notes.append(f"{quota.name} in {u.scope}: no limit to compare with (empty subnet?)")
            continue
        verdicts.append(Verdict(usage=u, quota=quota, limit=limit, raised=raised))
    for s in stacks(plans, config):
        for p in compute.pools(s):
            if p.unknown:
                notes.append(
                    f"{s.name}: {p.group['name']} may launch {', '.join(p.unknown)}, which "
                    f"{instances.TABLE_PATH} lacks: its addresses were not counted"
                )
    return Limits(verdicts=verdicts, notes=notes)


def summary_json(limits: Limits) -> dict[str, Any]:
    """Per quota: its figures, the highest count and how many scopes approach or exceed it."""
    table = quota_data.table()
    rows = []
    for key, quota in table.quotas.items():
        mine = [v for v in limits.verdicts if v.quota.key == key]
        peak = max(mine, key=lambda v: v.share, default=None)
        rows.append(
            {
                "key": key,
                "name": quota.name,
                "service": quota.service,
                "code": quota.code,
                "default": quota.default,
                "adjustable": quota.adjustable,
                "source": quota.source,
                "scopes": len(mine),
                "near": sum(1 for v in mine if v.state == "near"),
                "over": sum(1 for v in mine if v.state == "over"),
                "peak": None
                if peak is None
                else {
                    "used": peak.usage.used,
                    "limit": peak.limit,
                    "raised": peak.raised,
                    "scope": peak.usage.scope,
                    "stack": peak.usage.stack,
                    "share": round(peak.share, 3),
                },
            }
        )
    return {
        "read_on": table.read_on.isoformat(),
        "near_share": quota_data.NEAR,
        "quotas": rows,
        "reported": [
            {
                "quota": v.quota.key,
                "scope": v.usage.scope,
                "stack": v.usage.stack,
                "used": v.usage.used,
                "limit": v.limit,
                "state": v.state,
                "blocking": v.blocking,
                "message": v.message(),
            }
            for v in limits.reported
        ],
        "notes": list(limits.notes),
    }
