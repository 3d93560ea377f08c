"""`dlinfra site add|remove`: a site into or out of the fleet file and the address plan.

Every change validates the whole result before it writes anything; the fleet file is edited round-trip
(comments and order kept) and written atomically after the lock.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from dlinfra.errors import DlinfraError
from dlinfra.files import mode_of, write_atomic
from dlinfra.model import planner, site_stacks
from dlinfra.model.fleet.load import LoadedFleet, load_fleet, validate_data
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.site_stacks import Touched
from dlinfra.model.sites import Net, activation_expiry_problem, site_lan, stack_of

Routing = Literal["static", "bgp"]


@dataclass(frozen=True, kw_only=True)
class NewSite:
    """What `dlinfra site add` was given."""

    name: str
    region: str
    public_ip: str
    asn: int
    environment: str = "prod"
    lan: str | None = None  # explicit LAN; else allocated from the supernet
    routing: Routing = "static"
    gpu_nodes: int | None = None
    gpus_per_node: int | None = None  # default: the fleet model's (8)
    gpu_model: str | None = None  # default: the fleet model's (H100)
    gpu_product: str | None = None  # the NVML name, where the model comes as more than one (A100: 40GB or 80GB)
    nfs: tuple[tuple[str, str, str], ...] = ()  # (server, export, mount point)
    pod_cidr: str | None = None  # explicit pod CIDR of its hybrid nodes; else allocated
    # Until when its SSM activation registers machines (UTC, at most 30 days ahead); default: AWS's 24 hours
    activation_expiry: datetime.datetime | None = None

    def entry(self) -> CommentedMap:
        """The fleet entry, in the order the reference fleet writes sites."""
        entry = CommentedMap()
        entry["region"] = self.region
        entry["environment"] = self.environment
        entry["public_ip"] = self.public_ip
        entry["asn"] = self.asn
        entry["routing"] = self.routing
        if self.lan is not None:
            entry["lan"] = self.lan
        if self.pod_cidr is not None:
            entry["pod_cidr"] = self.pod_cidr
        if self.gpu_nodes is not None:
            entry["gpu_nodes"] = self.gpu_nodes
        if self.gpus_per_node is not None:
            entry["gpus_per_node"] = self.gpus_per_node
        if self.gpu_model is not None:
            entry["gpu_model"] = self.gpu_model
        if self.gpu_product is not None:
            entry["gpu_product"] = self.gpu_product
        if self.nfs:
            mounts = []
            for server, export, mount_point in self.nfs:
                mount = CommentedMap()
                mount["server"], mount["export"], mount["mount_point"] = server, export, mount_point
                mounts.append(mount)
            entry["nfs"] = mounts
        if self.activation_expiry is not None:
            entry["activation_expiry"] = _utc_stamp(self.activation_expiry)
        return entry


@dataclass(frozen=True)
class SiteChange:
    """The result of `site add` or `site remove`: the new fleet, its plan, and what was written."""

    fleet: Fleet
    plan: planner.Plan
    site: str
    allocations: dict[str, Net]  # the site's allocation keys and CIDRs
    home_stack: str  # the regional stack that declares (or declared) the site's VPN
    stacks: tuple[Touched, ...]  # the stacks to apply, in apply order, and what the change moves in each
    released: bool = False


def add_site(fleet_path: Path, lock_path: Path, new: NewSite, *, now: datetime.datetime | None = None) -> SiteChange:
    """Add a site to the fleet and allocate its ranges; validates everything first, writes lock then fleet.

    `now` is when the site's activation expiry is judged from (default: the clock)."""
    loaded = load_fleet(fleet_path)
    where = f"sites.{new.name}"
    if new.name in loaded.fleet.sites:
        raise DlinfraError(
            f"site {new.name!r} already exists (home region {loaded.fleet.sites[new.name].region}); "
            "pick another name, or `dlinfra site remove` it first",
            file=str(fleet_path),
            key=where,
        )
    taken = {str(s.public_ip): n for n, s in loaded.fleet.sites.items()}
    if new.public_ip in taken:
        raise DlinfraError(
            f"{new.public_ip} is already site {taken[new.public_ip]!r}'s gateway; each site needs its own "
            "customer gateway address",
            file=str(fleet_path),
            key=f"{where}.public_ip",
        )
    _check_activation(new, fleet_path, now or datetime.datetime.now(datetime.UTC))
    lock = planner.load_lock(lock_path)
    # The lock must already cover the fleet, so that the only new allocations are the site's.
    before = planner.plan(loaded, lock)
    text = fleet_path.read_text()
    edited = _insert_site(text, new.name, new.entry())
    data = _parse_edit(edited, fleet_path)
    _check_edit(text, data, fleet_path, added={new.name: new.entry()})
    fleet = validate_data(data, fleet_path)
    plan = planner.plan(LoadedFleet(fleet, fleet_path), lock, update=True)
    _check_nfs(new, site_lan(plan, new.name), fleet_path)
    touched = site_stacks.touched((loaded.fleet, before), (fleet, plan))
    planner.save_lock(plan.to_lock(lock_path), lock_path)
    write_atomic(fleet_path, edited, mode=mode_of(fleet_path))
    return SiteChange(
        fleet=fleet,
        plan=plan,
        site=new.name,
        allocations=_site_allocations(plan, new.name),
        home_stack=stack_of(fleet, new.name),
        stacks=tuple(touched),
    )


def remove_site(fleet_path: Path, lock_path: Path, name: str, *, release: bool) -> SiteChange:
    """Remove a site from the fleet; its lock entries stay reserved (orphans) unless release is set."""
    loaded = load_fleet(fleet_path)
    if name not in loaded.fleet.sites:
        known = ", ".join(loaded.fleet.sites) or "none"
        raise DlinfraError(f"no site {name!r} in the fleet (sites: {known})", file=str(fleet_path), key=f"sites.{name}")
    lock = planner.load_lock(lock_path)
    before = planner.plan(loaded, lock)
    owned = _site_allocations(before, name)
    home_stack = stack_of(loaded.fleet, name)
    text = fleet_path.read_text()
    edited = _delete_site(text, name)
    data = _parse_edit(edited, fleet_path)
    _check_edit(text, data, fleet_path, removed=name)
    fleet = validate_data(data, fleet_path)
    if release:
        lock = planner.release(lock, owned)
    plan = planner.plan(LoadedFleet(fleet, fleet_path), lock)
    touched = site_stacks.touched((loaded.fleet, before), (fleet, plan))
    if release:
        planner.save_lock(plan.to_lock(lock_path), lock_path)
    write_atomic(fleet_path, edited, mode=mode_of(fleet_path))
    return SiteChange(
        fleet=fleet,
        plan=plan,
        site=name,
        allocations=owned,
        home_stack=home_stack,
        stacks=tuple(touched),
        released=release,
    )


def _utc_stamp(instant: datetime.datetime) -> str:
    return instant.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def _check_activation(new: NewSite, fleet_path: Path, now: datetime.datetime) -> None:
    """The activation expiry AWS will take: GPU machines to register, an aware instant, at most 30 days ahead."""
    if new.activation_expiry is None:
        return
    key = f"sites.{new.name}.activation_expiry"
    if not new.gpu_nodes:
        raise DlinfraError(
            "the site has no GPU machines (gpu_nodes 0), so it gets no SSM activation to expire; give --gpu-nodes, "
            "or leave the expiry out",
            file=str(fleet_path),
            key=key,
        )
    if new.activation_expiry.utcoffset() is None:
        raise DlinfraError(
            f"{new.activation_expiry.isoformat()} has no time zone: write it in UTC, e.g. 2026-12-20T00:00:00Z",
            file=str(fleet_path),
            key=key,
        )
    problem = activation_expiry_problem(new.activation_expiry, now)
    if problem:
        raise DlinfraError(problem, file=str(fleet_path), key=key)


def _check_nfs(new: NewSite, lan: Net, fleet_path: Path) -> None:
    """Each NFS server is a host of the site's LAN: the GPU machines mount it there, not through the tunnels."""
    for i, (server, export, mount_point) in enumerate(new.nfs):
        address = ipaddress.IPv4Address(server)
        if address in lan and address not in (lan.network_address, lan.broadcast_address):
            continue
        where = "is the network or broadcast address of" if address in lan else "is outside"
        hint = "a server on it" if new.lan else f"a server on it, or --lan with the LAN {server} is on"
        raise DlinfraError(
            f"{server} (--nfs {server}:{export}:{mount_point}) {where} the site's LAN {lan}: the GPU machines "
            f"mount their NFS exports on that LAN; give {hint}",
            file=str(fleet_path),
            key=f"sites.{new.name}.nfs[{i}].server",
        )


def _site_allocations(plan: planner.Plan, site: str) -> dict[str, Net]:
    keys = (f"site-lan/{site}", f"hybrid-pods/{site}", f"tunnel/{site}/1", f"tunnel/{site}/2")
    merged = {k: a.cidr for k, a in plan.allocations.items()} | dict(plan.orphans)
    return {k: merged[k] for k in keys if k in merged}


# Editing the fleet file. ruamel's round-trip tree locates every key (line and column); the edit itself is
# a splice of whole lines, so every other byte of the file (comments, blank lines, quoting, flow style) stays
# exactly as written. Dumping the whole tree instead moves the comments that ruamel attaches to the last
# value of a section (such as the blank line before `teams:`) together with that value.
def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # never re-wrap a long line
    return yaml


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _end_of_block(lines: list[str], start: int, stop: int) -> int:
    """Index after the last content line in lines[start:stop] (trailing blank and comment lines excluded)."""
    end = stop
    while end > start and not _is_content(lines[end - 1]):
        end -= 1
    return end


def _next_top_level_line(data: CommentedMap, key: str, default: int) -> int:
    keys = list(data)
    following = keys[keys.index(key) + 1 :]
    return int(data.lc.key(following[0])[0]) if following else default


def _insert_site(text: str, name: str, entry: CommentedMap) -> str:
    """The fleet text with `name: entry` appended at the end of `sites:` (created if absent)."""
    data = _yaml().load(text)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    sites = data.get("sites")
    if isinstance(sites, CommentedMap) and sites:
        first = next(iter(sites))
        column = int(sites.lc.key(first)[1])
        stop = _next_top_level_line(data, "sites", len(lines))
        at = _end_of_block(lines, int(sites.lc.key(first)[0]), stop)
        return "".join(lines[:at] + _entry_lines(name, entry, column) + lines[at:])
    block = ["sites:\n", *_entry_lines(name, entry, 2)]
    if "sites" in data:  # `sites:` or `sites: {}`: the header line is replaced
        at = int(data.lc.key("sites")[0])
        return "".join(lines[:at] + block + lines[at + 1 :])
    if "teams" in data:
        at = int(data.lc.key("teams")[0])
        return "".join(lines[:at] + block + ["\n"] + lines[at:])
    return "".join([*lines, "\n", *block])


def _entry_lines(name: str, entry: CommentedMap, column: int) -> list[str]:
    buf = io.StringIO()
    _yaml().dump({name: entry}, buf)
    lines = [" " * column + line if line.strip() else line for line in buf.getvalue().splitlines(keepends=True)]
    lines[0] = lines[0].rstrip("\n") + "  # added by `dlinfra site add`\n"
    return lines


def _delete_site(text: str, name: str) -> str:
    """The fleet text without the site's entry (its key line through its last content line)."""
    data = _yaml().load(text)
    lines = text.splitlines(keepends=True)
    sites: CommentedMap = data["sites"]
    keys = list(sites)
    start = int(sites.lc.key(name)[0])
    index = keys.index(name)
    if index + 1 < len(keys):
        stop = int(sites.lc.key(keys[index + 1])[0])
    else:
        stop = _next_top_level_line(data, "sites", len(lines))
    end = _end_of_block(lines, start, stop)
    kept = lines[:start] + lines[end:]
    if len(keys) == 1:
        # The section is left empty: `sites: {}` keeps it a mapping (a bare `sites:` would be null).
        at = int(data.lc.key("sites")[0])
        header = kept[at].rstrip("\n")
        code, sep, comment = header.partition("#")
        kept[at] = f"{code.rstrip()} {{}}" + (f"  {sep}{comment}" if sep else "") + "\n"
    return "".join(kept)


def _parse_edit(text: str, fleet_path: Path) -> Any:
    try:
        return _yaml().load(text)
    except Exception as exc:  # noqa: BLE001 - any parse failure here is a bug in the splice, reported plainly
        raise DlinfraError(
            f"editing the fleet file produced invalid YAML ({type(exc).__name__}); nothing was written. "
            "Please add the site by hand and report this",
            file=str(fleet_path),
        ) from None


def _plain(node: Any) -> Any:
    """A round-trip tree as plain dicts, lists and scalars, for comparing content."""
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _check_edit(
    before: str,
    after: Any,
    fleet_path: Path,
    *,
    added: Mapping[str, CommentedMap] | None = None,
    removed: str | None = None,
) -> None:
    """The splice changed exactly the one site, nothing else."""
    expected = _plain(_yaml().load(before))
    sites = dict(expected.get("sites") or {})
    for name, entry in (added or {}).items():
        sites[name] = _plain(entry)
    if removed is not None:
        sites.pop(removed, None)
    expected["sites"] = sites
    got = _plain(after)
    got["sites"] = dict(got.get("sites") or {})
    if got != expected:
        raise DlinfraError(
            "editing the fleet file would change more than the site; nothing was written. "
            "Please edit sites: by hand and report this",
            file=str(fleet_path),
        )


def next_steps_after_add(change: SiteChange, fleet_path: Path) -> list[str]:
    """The commands that bring a newly added site up, in order: every stack the change touches, then the render."""
    home, site = change.home_stack, change.site
    steps = [f"review and commit {fleet_path.name} and the lock", *apply_steps(change)]
    steps += [
        f"pulumi stack output --json --show-secrets --stack {home} > {home}.outputs.json",
        f"dlinfra site render {site} --outputs {home}.outputs.json    # swanctl.conf, frr.conf, node JSON",
        f"shred -u {home}.outputs.json    # it holds the tunnels' pre-shared keys",
    ]
    return steps


def apply_steps(change: SiteChange) -> list[str]:
    """`pulumi up` of each stack the change touches, in apply order, saying what it changes there."""
    width = max((len(stack.role.name) for stack in change.stacks), default=0)
    steps = []
    for stack in change.stacks:
        what = "; ".join(stack.why) or "a new stack"
        if stack.role.runs_in_vpc:
            what += "; from inside the VPC"
        steps.append(f"pulumi up --stack {stack.role.name:<{width}}    # {what}")
    return steps
