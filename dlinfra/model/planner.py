"""The address plan: every CIDR the fleet needs, allocated once and recorded in a lock file, like an IPAM.

Pure planning code (no pulumi import). Allocations are keyed by stable names derived from the fleet
(`vpc/prod/us-west-2`, `site-lan/sjc1`, ...). Once a key is in the lock its CIDR never changes; new keys
take the first free aligned block in their pool. Nothing is freed unless `release` is called.
"""

from __future__ import annotations

import bisect
import ipaddress
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dlinfra.errors import DlinfraError, LockError
from dlinfra.files import mode_of, write_atomic
from dlinfra.model.fleet.load import LoadedFleet, parse_yaml
from dlinfra.model.fleet.schema import Fleet, is_rfc1918
from dlinfra.model.textcache import last_by_text

Net = ipaddress.IPv4Network
Kind = Literal["vpc", "subnet", "client_vpn", "service", "site_lan", "hybrid_pods", "tunnel"]

LINK_LOCAL = Net("169.254.0.0/16")
# AWS rejects 169.254.0.0/30 ... 169.254.5.0/30 and 169.254.169.252/30 as tunnel inside CIDRs. We keep the
# whole of 169.254.0.0-169.254.5.255 out of use, so a reading of "through" as a range is also satisfied.
AWS_RESERVED_TUNNEL_BLOCKS = (Net("169.254.0.0/22"), Net("169.254.4.0/23"), Net("169.254.169.252/30"))
SUBNET_TIERS = ("private", "public", "transit")
LOCK_VERSION = 1

_KIND_OF_PREFIX: dict[str, Kind] = {
    "vpc": "vpc",
    "subnet": "subnet",
    "client-vpn": "client_vpn",
    "service": "service",
    "site-lan": "site_lan",
    "hybrid-pods": "hybrid_pods",
    "tunnel": "tunnel",
}


@dataclass(frozen=True)
class Request:
    """One CIDR the fleet needs: its stable key, size, pool and the fleet key that asked for it."""

    key: str
    kind: Kind
    prefix: int
    source: str  # fleet key, for error messages
    parent: str | None = None  # allocation key of the containing block (subnets), else None
    explicit: Net | None = None  # CIDR written in the fleet


@dataclass(frozen=True)
class Allocation:
    """A CIDR in the plan."""

    key: str
    kind: Kind
    cidr: Net
    source: str
    explicit: bool = False


@dataclass(frozen=True)
class Lock:
    """The committed lock: allocation key -> CIDR."""

    allocations: Mapping[str, Net] = field(default_factory=dict)
    path: Path | None = None


@dataclass(frozen=True)
class Plan:
    """The validated address plan of a fleet."""

    allocations: Mapping[str, Allocation]
    orphans: Mapping[str, Net]  # in the lock, no longer in the fleet: reserved until released

    def cidr(self, key: str) -> Net:
        """The CIDR of an allocation key."""
        return self.allocations[key].cidr

    def of_kind(self, kind: Kind) -> list[Allocation]:
        """Allocations of one kind, sorted by key."""
        return sorted((a for a in self.allocations.values() if a.kind == kind), key=lambda a: a.key)

    def vpc(self, env: str, region: str) -> Net:
        return self.cidr(vpc_key(env, region))

    def subnets(self, env: str, region: str, tier: str) -> dict[str, Net]:
        """AZ name -> subnet CIDR for one tier of one VPC."""
        prefix = f"subnet/{env}/{region}/{tier}/"
        return {k.removeprefix(prefix): a.cidr for k, a in sorted(self.allocations.items()) if k.startswith(prefix)}

    def to_lock(self, path: Path | None = None) -> Lock:
        """The lock that records this plan (orphans kept)."""
        merged = {k: a.cidr for k, a in self.allocations.items()} | dict(self.orphans)
        return Lock(allocations=dict(sorted(merged.items())), path=path)


def vpc_key(env: str, region: str) -> str:
    return f"vpc/{env}/{region}"


def subnet_key(env: str, region: str, tier: str, az: str) -> str:
    return f"subnet/{env}/{region}/{tier}/{az}"


def kind_of(key: str) -> Kind:
    """The kind an allocation key denotes; LockError for a key dlinfra never writes."""
    kind = _KIND_OF_PREFIX.get(key.split("/", 1)[0])
    if kind is None:
        raise LockError(f"unknown allocation key (known prefixes: {', '.join(_KIND_OF_PREFIX)})", key=key)
    return kind


def subnet_prefixes(vpc_prefix: int, azs: int) -> dict[str, int]:
    """Tier sizes inside a VPC: private node subnets take most of it, public and transit stay small."""
    # Private subnets hold node and pod IPs (VPC CNI gives every pod a VPC address), so they get the
    # largest power-of-two share that still leaves one share free for the small tiers.
    private = vpc_prefix + math.ceil(math.log2(azs + 1))
    return {"private": min(private, 28), "public": min(vpc_prefix + 8, 28), "transit": 28}


def requests(fleet: Fleet) -> list[Request]:
    """Every CIDR the fleet needs, with its stable key."""
    space = fleet.address_space
    out: list[Request] = []
    for env_name, region in fleet.regional_stacks():
        spec = fleet.environments[env_name].regions[region]
        src = f"environments.{env_name}.regions.{region}"
        vpc = vpc_key(env_name, region)
        out.append(Request(vpc, "vpc", fleet.vpc_prefix(env_name), f"{src}.vpc_cidr", explicit=spec.vpc_cidr))
        sizes = subnet_prefixes(fleet.vpc_prefix(env_name), len(fleet.azs(region)))
        for tier in SUBNET_TIERS:
            for az in fleet.azs(region):
                out.append(Request(subnet_key(env_name, region, tier, az), "subnet", sizes[tier], src, parent=vpc))
        if fleet.environments[env_name].client_vpn:
            out.append(
                Request(
                    f"client-vpn/{env_name}/{region}",
                    "client_vpn",
                    space.client_vpn_prefix,
                    f"{src}.client_vpn_cidr",
                    explicit=spec.client_vpn_cidr,
                )
            )
        out.append(Request(f"service/{env_name}/{region}", "service", space.service_prefix, src))
    for site_name, site in fleet.sites.items():
        src = f"sites.{site_name}"
        out.append(Request(f"site-lan/{site_name}", "site_lan", space.site_lan_prefix, f"{src}.lan", explicit=site.lan))
        out.append(
            Request(
                f"hybrid-pods/{site_name}",
                "hybrid_pods",
                space.hybrid_pod_prefix,
                f"{src}.pod_cidr",
                explicit=site.pod_cidr,
            )
        )
        for tunnel in (1, 2):
            out.append(Request(f"tunnel/{site_name}/{tunnel}", "tunnel", 30, src))
    return out


class _Pool:
    """Free-space search in one block: sorted used intervals, first fit on aligned boundaries."""

    def __init__(self, block: Net) -> None:
        self.block = block
        self.used: list[tuple[int, int]] = []

    def take(self, net: Net) -> None:
        bisect.insort(self.used, (int(net.network_address), int(net.broadcast_address)))

    def first_fit(self, prefix: int) -> Net | None:
        if prefix < self.block.prefixlen:
            return None
        size = 1 << (32 - prefix)
        start, end = int(self.block.network_address), int(self.block.broadcast_address)
        candidate = start
        for lo, hi in self.used:
            if hi < candidate:
                continue
            if lo > candidate + size - 1:
                break
            candidate = -(-(hi + 1) // size) * size  # align up past the used interval
        if candidate + size - 1 > end:
            return None
        return Net((candidate, prefix))


def plan(loaded: LoadedFleet, lock: Lock, *, update: bool = False) -> Plan:
    """Check the lock against the fleet and return the plan; with update, allocate what the lock lacks.

    Raises DlinfraError naming the file and key on any problem; never changes an existing allocation.
    """
    fleet, fleet_file = loaded.fleet, str(loaded.path)
    lock_file = str(lock.path) if lock.path else "cidr lock"
    reqs = requests(fleet)
    wanted = {r.key: r for r in reqs}
    _check_lock_entries(lock, lock_file)
    allocations: dict[str, Allocation] = {}
    missing: list[Request] = []
    for req in reqs:
        locked = lock.allocations.get(req.key)
        if req.explicit is not None and locked is not None and req.explicit != locked:
            raise DlinfraError(
                f"the fleet says {req.explicit} but {lock_file} has {locked} for {req.key}; changing it would "
                f"replace live networks. To renumber on purpose, run `dlinfra cidr --release {req.key}` first",
                file=fleet_file,
                key=req.source,
            )
        if locked is not None:
            if locked.prefixlen != req.prefix and req.explicit is None and req.kind == "tunnel":
                raise LockError(f"{locked} is not a /30", file=lock_file, key=req.key)
            allocations[req.key] = Allocation(req.key, req.kind, locked, req.source, req.explicit is not None)
        elif req.explicit is not None:
            allocations[req.key] = Allocation(req.key, req.kind, req.explicit, req.source, True)
            missing.append(req)
        else:
            missing.append(req)
    orphans = {k: v for k, v in lock.allocations.items() if k not in wanted}
    _check_disjoint(allocations, orphans, fleet_file, lock_file)
    unallocated = [r for r in missing if r.key not in allocations]
    if missing and not update:
        keys = ", ".join(r.key for r in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise LockError(
            f"{len(missing)} allocation(s) the fleet needs are not in the lock ({keys}); "
            "run `dlinfra cidr --update` to allocate them and commit the lock",
            file=lock_file,
            key=missing[0].source,
        )
    _allocate(fleet, fleet_file, unallocated, allocations, orphans)
    return Plan(allocations=dict(sorted(allocations.items())), orphans=dict(sorted(orphans.items())))


def _check_lock_entries(lock: Lock, lock_file: str) -> None:
    for key, net in lock.allocations.items():
        kind = kind_of(key)
        if kind == "tunnel":
            if net.prefixlen != 30 or not net.subnet_of(LINK_LOCAL):
                raise LockError(f"{net} is not a /30 inside 169.254.0.0/16", file=lock_file, key=key)
            if any(net.overlaps(r) for r in AWS_RESERVED_TUNNEL_BLOCKS):
                raise LockError(f"{net} is one of the tunnel blocks AWS reserves", file=lock_file, key=key)
        elif not is_rfc1918(net):
            raise LockError(f"{net} is not inside an RFC 1918 range", file=lock_file, key=key)


def _parent_key(key: str) -> str | None:
    if key.startswith("subnet/"):
        _, env, region, *_ = key.split("/")
        return vpc_key(env, region)
    return None


def _check_disjoint(
    allocations: Mapping[str, Allocation], orphans: Mapping[str, Net], fleet_file: str, lock_file: str
) -> None:
    """Every top-level block disjoint from every other; every subnet inside its VPC, disjoint from siblings."""
    entries: list[tuple[str, Net, str, bool]] = [
        (a.key, a.cidr, a.source, a.explicit) for a in allocations.values()
    ] + [(k, n, k, False) for k, n in orphans.items()]
    groups: dict[str | None, list[tuple[str, Net, str, bool]]] = {}
    nets = {key: net for key, net, _, _ in entries}
    for entry in entries:
        parent = _parent_key(entry[0])
        groups.setdefault(parent, []).append(entry)
        if parent is not None:
            if parent not in nets:
                raise LockError(f"subnet {entry[1]} has no VPC {parent} in the lock", file=lock_file, key=entry[0])
            if not entry[1].subnet_of(nets[parent]):
                raise LockError(f"{entry[1]} is outside its VPC {nets[parent]}", file=lock_file, key=entry[0])
    for group in groups.values():
        # Sorted by start address, an entry overlaps an earlier one exactly when it starts before the
        # furthest end seen so far, so one pass finds every overlap.
        widest: tuple[str, Net, str, bool] | None = None
        for entry in sorted(group, key=lambda e: (int(e[1].network_address), -e[1].prefixlen, e[0])):
            if widest is not None and entry[1].overlaps(widest[1]):
                raise _overlap_error(widest, entry, fleet_file, lock_file)
            if widest is None or entry[1].broadcast_address > widest[1].broadcast_address:
                widest = entry


def _overlap_error(
    a: tuple[str, Net, str, bool], b: tuple[str, Net, str, bool], fleet_file: str, lock_file: str
) -> DlinfraError:
    """Blame the fleet when an explicit CIDR is involved, else the lock (only hand edits get there)."""
    (ka, na, sa, ea), (kb, nb, sb, eb) = a, b
    if ea and eb:
        return DlinfraError(f"{nb} overlaps {sa} ({na})", file=fleet_file, key=sb)
    if ea or eb:
        src, net, other, onet = (sb, nb, ka, na) if eb else (sa, na, kb, nb)
        return DlinfraError(f"{net} overlaps {onet}, allocated to {other} in {lock_file}", file=fleet_file, key=src)
    return LockError(f"{nb} overlaps {ka} ({na}); was the lock edited by hand?", file=lock_file, key=kb)


def _allocate(
    fleet: Fleet,
    fleet_file: str,
    todo: Iterable[Request],
    allocations: dict[str, Allocation],
    orphans: Mapping[str, Net],
) -> None:
    """First-fit allocation of new keys; large blocks first, then by key, so results do not depend on order."""
    supernet = fleet.address_space.supernet
    pools: dict[str | None, _Pool] = {None: _Pool(supernet), "tunnel": _Pool(LINK_LOCAL)}
    for reserved in AWS_RESERVED_TUNNEL_BLOCKS:
        pools["tunnel"].take(reserved)
    for key, net in [(a.key, a.cidr) for a in allocations.values()] + list(orphans.items()):
        parent = _parent_key(key)
        if parent is not None:
            block = allocations[parent].cidr if parent in allocations else orphans.get(parent, net)
            pools.setdefault(parent, _Pool(block)).take(net)
        elif kind_of(key) == "tunnel":
            pools["tunnel"].take(net)
        elif net.overlaps(supernet):
            pools[None].take(net)
    # VPCs before subnets (a subnet needs its VPC), then widest first to limit fragmentation.
    for req in sorted(todo, key=lambda r: (r.parent is not None, r.prefix, r.key)):
        pool_key = req.parent if req.parent is not None else ("tunnel" if req.kind == "tunnel" else None)
        if pool_key is not None and pool_key not in pools:
            pools[pool_key] = _Pool(allocations[pool_key].cidr)
        pool = pools[pool_key]
        found = pool.first_fit(req.prefix)
        if found is None:
            what = (
                "VPC " + str(pool.block)
                if req.parent
                else ("169.254.0.0/16" if req.kind == "tunnel" else f"supernet {supernet}")
            )
            hint = (
                "use fewer AZs or a larger vpc_prefix"
                if req.parent
                else "widen address_space.supernet or use smaller prefixes"
            )
            raise DlinfraError(
                f"no free /{req.prefix} left in {what} for {req.key}; {hint}", file=fleet_file, key=req.source
            )
        pool.take(found)
        allocations[req.key] = Allocation(req.key, req.kind, found, req.source, False)


def release(lock: Lock, keys: Iterable[str]) -> Lock:
    """A lock without the given keys (a subnet's VPC takes its subnets with it). Unknown keys are errors."""
    drop = set(keys)
    for key in drop:
        if key not in lock.allocations:
            raise LockError("no such allocation in the lock", file=str(lock.path or "cidr lock"), key=key)
    vpcs = {k for k in drop if k.startswith("vpc/")}
    kept = {k: v for k, v in lock.allocations.items() if k not in drop and _parent_key(k) not in vpcs}
    return Lock(allocations=kept, path=lock.path)


def load_lock(path: str | Path, *, missing_ok: bool = False) -> Lock:
    """Read the lock file; LockError naming the file and entry on any problem."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return Lock(path=path)
        raise LockError("lock file not found; run `dlinfra cidr --update` to create it", file=str(path))
    lock = _lock_of(path)
    return lock if lock.path == path else Lock(allocations=lock.allocations, path=path)


@last_by_text
def _lock_of(path: Path) -> Lock:
    try:
        data = parse_yaml(path)
    except DlinfraError as exc:
        raise LockError(exc.detail, file=str(path)) from None
    if not isinstance(data, Mapping) or set(data) - {"version", "allocations"}:
        raise LockError("expected a mapping with keys version and allocations", file=str(path))
    if data.get("version") != LOCK_VERSION:
        raise LockError(f"unsupported version {data.get('version')!r} (expected {LOCK_VERSION})", file=str(path))
    raw = data.get("allocations") or {}
    if not isinstance(raw, Mapping):
        raise LockError("allocations must be a mapping of key: CIDR", file=str(path), key="allocations")
    out: dict[str, Net] = {}
    for key, value in raw.items():
        try:
            out[str(key)] = Net(str(value))
        except ValueError as exc:
            raise LockError(f"{value!r} is not a CIDR ({exc})", file=str(path), key=f"allocations.{key}") from None
        try:
            kind_of(str(key))
        except LockError as exc:
            raise LockError(exc.detail, file=str(path), key=f"allocations.{key}") from None
    return Lock(allocations=out, path=path)


def render_lock(lock: Lock) -> str:
    """The lock file's text: sorted, one allocation a line, stable across runs."""
    lines = [
        "# The address plan of this fleet, written by `dlinfra cidr --update`. Commit it with fleet.yaml.",
        "# Do not edit by hand: a changed entry renumbers (replaces) live networks. Free an entry with",
        "# `dlinfra cidr --release KEY`.",
        f"version: {LOCK_VERSION}",
        "allocations:",
    ]
    lines += [f"  {key}: {net}" for key, net in sorted(lock.allocations.items())]
    return "\n".join(lines) + "\n"


def save_lock(lock: Lock, path: str | Path) -> None:
    """Write the lock atomically, so an interrupted write never leaves half a plan."""
    path = Path(path)
    write_atomic(path, render_lock(lock), mode=mode_of(path))


def rows(plan_: Plan) -> Iterator[dict[str, str]]:
    """The plan as flat records (name, kind, cidr, source, state) for tables and JSON."""
    for alloc in plan_.allocations.values():
        yield {
            "name": alloc.key,
            "kind": alloc.kind,
            "cidr": str(alloc.cidr),
            "source": alloc.source,
            "state": "explicit" if alloc.explicit else "allocated",
        }
    for key, net in plan_.orphans.items():
        yield {"name": key, "kind": kind_of(key), "cidr": str(net), "source": "", "state": "orphaned"}
