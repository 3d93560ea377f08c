"""Physical GPU sites: their networks in the address plan, onboarding (`site add|remove`) and rendering
the site gateway's files from a regional stack's outputs (`site render`).

Pure planning code (no pulumi import). Every command validates the whole result before it writes anything;
the fleet file is edited round-trip (comments and order kept) and written atomically after the lock.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from dlinfra.errors import DlinfraError
from dlinfra.model import planner
from dlinfra.model.fleet import Fleet, LoadedFleet, Site, load_fleet, validate_data
from dlinfra.render.nodeadm import HybridNodeView, render_node_config
from dlinfra.render.strongswan import (
    FailoverBudget,
    SiteVpnView,
    Tunnel,
    failover_budget,
    render_charon,
    render_frr,
    render_nftables,
    render_swanctl,
    render_sysctl,
    render_xfrm_script,
)

Net = ipaddress.IPv4Network
Routing = Literal["static", "bgp"]

# Where the site-gateway Chef role expects the rendered files (chef/cookbooks/dlinfra_gateway attributes).
DEFAULT_INSTALL_DIR = "/etc/dlinfra/site"
# What `pulumi stack output --json` prints for a secret without --show-secrets.
SECRET_PLACEHOLDER = "[secret]"


# --- the site's networks in the plan ------------------------------------------------------------------
@dataclass(frozen=True)
class Destination:
    """A network of an environment that other networks route to, keyed by a stable fleet-derived name."""

    key: str  # vpc-<region>, lan-<site> or pods-<site>: used in logical resource names
    cidr: Net
    region: str  # where it attaches: the VPC's region, or the site's home region
    site: str | None = None  # the site it belongs to, for site networks


def site_lan(plan: planner.Plan, site: str) -> Net:
    """The site's LAN (explicit in the fleet, or allocated)."""
    return plan.cidr(f"site-lan/{site}")


def site_pods(plan: planner.Plan, site: str) -> Net:
    """The pod CIDR of the site's hybrid nodes."""
    return plan.cidr(f"hybrid-pods/{site}")


def tunnel_cidrs(plan: planner.Plan, site: str) -> tuple[Net, Net]:
    """Inside /30s of the site's VPN tunnels 1 and 2."""
    return plan.cidr(f"tunnel/{site}/1"), plan.cidr(f"tunnel/{site}/2")


def environment_networks(fleet: Fleet, plan: planner.Plan, env: str) -> list[Destination]:
    """Every VPC of an environment and every network of its sites (LAN and hybrid pods), in fleet order."""
    out = [Destination(f"vpc-{region}", plan.vpc(env, region), region) for region in fleet.environments[env].regions]
    for name, site in fleet.sites_of(env).items():
        out.append(Destination(f"lan-{name}", site_lan(plan, name), site.region, name))
        out.append(Destination(f"pods-{name}", site_pods(plan, name), site.region, name))
    return out


def site_remote_cidrs(fleet: Fleet, plan: planner.Plan, site: str) -> list[Net]:
    """What a site reaches through its tunnels: the environment's VPCs and the other sites' networks."""
    env = fleet.sites[site].environment
    return [d.cidr for d in environment_networks(fleet, plan, env) if d.site != site]


def stack_of(fleet: Fleet, site: str) -> str:
    """The regional stack that declares a site's VPN: `<environment>-<home region>`."""
    spec = fleet.sites[site]
    return f"{spec.environment}-{spec.region}"


# --- site add / remove ---------------------------------------------------------------------------------
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
    nfs: tuple[tuple[str, str, str], ...] = ()  # (server, export, mount point)
    pod_cidr: str | None = None  # explicit pod CIDR of its hybrid nodes; else allocated

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
        if self.nfs:
            mounts = []
            for server, export, mount_point in self.nfs:
                mount = CommentedMap()
                mount["server"], mount["export"], mount["mount_point"] = server, export, mount_point
                mounts.append(mount)
            entry["nfs"] = mounts
        return entry


@dataclass(frozen=True)
class SiteChange:
    """The result of `site add` or `site remove`: the new fleet, its plan, and what was written."""

    fleet: Fleet
    plan: planner.Plan
    site: str
    allocations: dict[str, Net]  # the site's allocation keys and CIDRs
    home_stack: str  # the regional stack that declares (or declared) the site's VPN
    released: bool = False


def add_site(fleet_path: Path, lock_path: Path, new: NewSite) -> SiteChange:
    """Add a site to the fleet and allocate its ranges; validates everything first, writes lock then fleet."""
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
    lock = planner.load_lock(lock_path)
    # The lock must already cover the fleet, so that the only new allocations are the site's.
    planner.plan(loaded, lock)
    text = fleet_path.read_text()
    edited = _insert_site(text, new.name, new.entry())
    data = _parse_edit(edited, fleet_path)
    _check_edit(text, data, fleet_path, added={new.name: new.entry()})
    fleet = validate_data(data, fleet_path)
    plan = planner.plan(LoadedFleet(fleet, fleet_path), lock, update=True)
    planner.save_lock(plan.to_lock(lock_path), lock_path)
    _write_atomic(fleet_path, edited, mode=_mode_of(fleet_path))
    return SiteChange(
        fleet=fleet,
        plan=plan,
        site=new.name,
        allocations=_site_allocations(plan, new.name),
        home_stack=stack_of(fleet, new.name),
    )


def remove_site(fleet_path: Path, lock_path: Path, name: str, *, release: bool) -> SiteChange:
    """Remove a site from the fleet; its lock entries stay reserved (orphans) unless release is set."""
    loaded = load_fleet(fleet_path)
    if name not in loaded.fleet.sites:
        known = ", ".join(loaded.fleet.sites) or "none"
        raise DlinfraError(f"no site {name!r} in the fleet (sites: {known})", file=str(fleet_path), key=f"sites.{name}")
    lock = planner.load_lock(lock_path)
    owned = _site_allocations(planner.plan(loaded, lock), name)
    home_stack = stack_of(loaded.fleet, name)
    text = fleet_path.read_text()
    edited = _delete_site(text, name)
    data = _parse_edit(edited, fleet_path)
    _check_edit(text, data, fleet_path, removed=name)
    fleet = validate_data(data, fleet_path)
    if release:
        lock = planner.release(lock, owned)
    plan = planner.plan(LoadedFleet(fleet, fleet_path), lock)
    if release:
        planner.save_lock(plan.to_lock(lock_path), lock_path)
    _write_atomic(fleet_path, edited, mode=_mode_of(fleet_path))
    return SiteChange(fleet=fleet, plan=plan, site=name, allocations=owned, home_stack=home_stack, released=release)


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


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds keys), atomically."""
    _write_atomic(path, text, mode=0o600)


def _mode_of(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o644


def _write_atomic(path: Path, text: str, *, mode: int) -> None:
    """Write a file so that readers see the old or the new content, never a half; created with `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --- site render -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderedSite:
    """What `site render` wrote."""

    view: SiteVpnView
    files: dict[str, Path]  # role (swanctl, frr, charon, sysctl, nftables, xfrm, node, ...) -> path
    failover: FailoverBudget  # worst case from an AWS endpoint going silent to the other tunnel, per the files


# The gateway's files other than swanctl.conf and its node JSON, by role (names the cookbook expects).
GATEWAY_FILES: Final[Mapping[str, str]] = {
    "frr": "frr.conf",
    "charon": "strongswan-dlinfra.conf",
    "sysctl": "sysctl-dlinfra-gateway.conf",
    "nftables": "dlinfra-mss.nft",
    "xfrm": "dlinfra-xfrm",
}


def load_outputs(path: Path) -> dict[str, Any]:
    """The JSON of `pulumi stack output --json --show-secrets`."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise DlinfraError(f"cannot read stack outputs: {exc.strerror}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise DlinfraError(
            f"not JSON ({exc.msg} at line {exc.lineno}); "
            "expected the output of `pulumi stack output --json --show-secrets`",
            file=str(path),
        ) from None
    if not isinstance(data, dict):
        raise DlinfraError("expected a JSON object of stack outputs", file=str(path))
    return data


def check_stack(outputs: Mapping[str, Any], env: str, region: str, *, source: str) -> None:
    """Refuse outputs of another stack than `<env>-<region>`."""
    got = (outputs.get("environment"), outputs.get("region"))
    if got != (env, region):
        raise DlinfraError(
            f"these are the outputs of stack {got[0]}-{got[1]}, but {env}-{region} is needed; run "
            f"`pulumi stack output --json --show-secrets --stack {env}-{region}`",
            file=source,
        )


def require_output(outputs: Mapping[str, Any], key: str, *, source: str, stack: str) -> Any:
    value = outputs.get(key)
    if value is None:
        raise DlinfraError(f"no output {key!r}: run `pulumi up --stack {stack}` first", file=source, key=key)
    if value == SECRET_PLACEHOLDER:
        raise DlinfraError(
            "the value is masked; export the outputs with `pulumi stack output --json --show-secrets`",
            file=source,
            key=key,
        )
    return value


def _as_int(value: Any, what: str, source: str) -> int:
    # The offline engine hands numbers back as floats; the CLI's JSON has integers.
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise DlinfraError(f"expected an integer, got {value!r}", file=source, key=what)
    return int(value)


def site_view(fleet: Fleet, site: str, outputs: Mapping[str, Any], *, source: str) -> SiteVpnView:
    """The render helper's view of one site, from the home stack's outputs, checked against the fleet."""
    spec = fleet.sites[site]
    stack = stack_of(fleet, site)
    check_stack(outputs, spec.environment, spec.region, source=source)
    connections = require_output(outputs, "site_vpns", source=source, stack=stack)
    if not isinstance(connections, Mapping) or site not in connections:
        raise DlinfraError(
            f"no VPN for site {site!r} in the outputs: run `pulumi up --stack {stack}` after `site add`",
            file=source,
            key=f"site_vpns.{site}",
        )
    conn = require_output(connections, site, source=source, stack=stack)
    key = f"site_vpns.{site}"
    stale = _stale_fields(spec, conn)
    if stale:
        raise DlinfraError(
            f"the stack outputs disagree with the fleet on {', '.join(stale)}; "
            f"run `pulumi up --stack {stack}` and export the outputs again",
            file=source,
            key=key,
        )
    try:
        tunnels = tuple(
            Tunnel(
                number=_as_int(t["number"], f"{key}.tunnels.number", source),
                outside_ip=str(t["outside_address"]),
                inside_cidr=str(t["inside_cidr"]),
                preshared_key=_unmasked(t["preshared_key"], f"{key}.tunnels.preshared_key", source),
            )
            for t in conn["tunnels"]
        )
        return SiteVpnView(
            site=site,
            local_public_ip=str(conn["public_ip"]),
            lan_cidr=str(conn["lan"]),
            remote_cidrs=tuple(str(c) for c in conn["remote_cidrs"]),
            tunnels=tunnels,  # type: ignore[arg-type]  # SiteVpnView checks there are exactly two
            routing=str(conn["routing"]),
            local_asn=_as_int(conn["asn"], f"{key}.asn", source),
            remote_asn=_as_int(conn["transit_asn"], f"{key}.transit_asn", source),
            pod_cidrs=tuple(str(c) for c in conn.get("pod_cidrs") or ()),
            tunnel_mode=spec.tunnel_mode,
        )
    except KeyError as exc:
        raise DlinfraError(f"missing field {exc.args[0]!r}", file=source, key=key) from None
    except (TypeError, ValueError) as exc:
        raise DlinfraError(str(exc), file=source, key=key) from None


def _unmasked(value: Any, what: str, source: str) -> str:
    if value == SECRET_PLACEHOLDER:
        raise DlinfraError(
            "the value is masked; export with `pulumi stack output --json --show-secrets`",
            file=source,
            key=what,
        )
    return str(value)


def _stale_fields(spec: Site, conn: Mapping[str, Any]) -> list[str]:
    fields = {"public_ip": str(spec.public_ip), "routing": spec.routing, "asn": spec.asn}
    out = []
    for name, want in fields.items():
        got = conn.get(name)
        if isinstance(want, int) and isinstance(got, int | float) and not isinstance(got, bool):
            got = int(got) if float(got).is_integer() else got
        if got != want:
            out.append(name)
    return out


def gateway_node(
    fleet: Fleet, site: str, view: SiteVpnView, conn: Mapping[str, Any], *, install_dir: str
) -> dict[str, Any]:
    """Chef node JSON for the site gateway (role site-gateway); points at the secret files, holds none."""
    spec = fleet.sites[site]
    swanctl = f"{install_dir}/swanctl.conf"
    # Route-based sites route over FRR (static routes or BGP); policy-based ones need it for BGP with AWS or
    # with their hybrid nodes.
    frr = f"{install_dir}/{GATEWAY_FILES['frr']}" if render_frr(view) is not None else None
    gateway: dict[str, Any] = {
        "routing": view.routing,
        "tunnel_mode": view.tunnel_mode,
        "swanctl_source": swanctl,
        "frr": frr is not None,
        "charon_source": f"{install_dir}/{GATEWAY_FILES['charon']}",
        "sysctl_source": f"{install_dir}/{GATEWAY_FILES['sysctl']}",
        "nftables_source": f"{install_dir}/{GATEWAY_FILES['nftables']}",
    }
    if frr:
        gateway["frr_source"] = frr
    if view.route_based:
        gateway["xfrm_source"] = f"{install_dir}/{GATEWAY_FILES['xfrm']}"
    return {
        "run_list": ["role[site-gateway]"],
        "dlinfra": {
            "site": {
                "name": site,
                "environment": spec.environment,
                "region": spec.region,
                "public_ip": view.local_public_ip,
                "asn": view.local_asn,
                "transit_asn": view.remote_asn,
                "routing": view.routing,
                "tunnel_mode": view.tunnel_mode,
                "lan": view.lan_cidr,
                "pod_cidrs": list(view.pod_cidrs),
                "remote_cidrs": list(view.remote_cidrs),
                "customer_gateway_id": conn.get("customer_gateway_id"),
                "vpn_connection_id": conn.get("vpn_connection_id"),
                "tunnels": [
                    {
                        "number": t.number,
                        "outside_address": t.outside_ip,
                        "inside_cidr": t.inside_cidr,
                        "aws_inside_address": t.aws_inside_ip,
                        "site_inside_address": t.site_inside_ip,
                        "interface": view.interface(t) if view.route_based else None,
                    }
                    for t in view.tunnels
                ],
                "swanctl_conf": swanctl,
                "frr_conf": frr,
                "nfs": [{"server": str(m.server), "export": m.export, "mount_point": m.mount_point} for m in spec.nfs],
            }
        },
        "dlinfra_gateway": gateway,
    }


def render_site(
    fleet: Fleet,
    site: str,
    outputs: Mapping[str, Any],
    out_dir: Path,
    *,
    source: str,
    install_dir: str = DEFAULT_INSTALL_DIR,
) -> RenderedSite:
    """Write the gateway's files (swanctl.conf 0600, frr.conf, charon, sysctl and nftables settings, the XFRM
    interface script) and its Chef node JSON into out_dir, and the GPU machines' files where the site has some."""
    if site not in fleet.sites:
        known = ", ".join(fleet.sites) or "none"
        raise DlinfraError(f"no site {site!r} in the fleet (sites: {known})", key=f"sites.{site}")
    view = site_view(fleet, site, outputs, source=source)
    conn = outputs["site_vpns"][site]
    swanctl = render_swanctl(view)
    frr = render_frr(view)
    node = gateway_node(fleet, site, view, conn, install_dir=install_dir)
    files = {"swanctl": out_dir / "swanctl.conf", "node": out_dir / "site-gateway.json"}
    write_private(files["swanctl"], swanctl)
    public: dict[str, str | None] = {
        "frr": frr,
        "charon": render_charon(view),
        "sysctl": render_sysctl(view),
        "nftables": render_nftables(view),
        "xfrm": render_xfrm_script(view),
    }
    for role, text in public.items():
        if text is not None:
            files[role] = out_dir / GATEWAY_FILES[role]
            _write_atomic(files[role], text, mode=0o755 if role == "xfrm" else 0o644)
    _write_atomic(files["node"], json.dumps(node, indent=2, sort_keys=True) + "\n", mode=0o644)
    hybrid = hybrid_view(fleet, site, outputs, source=source)
    if hybrid is not None:
        files["nodeadm"] = out_dir / "nodeadm.yaml"
        write_private(files["nodeadm"], render_node_config(hybrid))
        files["gpu-node"] = out_dir / "site-gpu-node.json"
        gpu_node = gpu_node_json(fleet, site, install_dir=install_dir)
        _write_atomic(files["gpu-node"], json.dumps(gpu_node, indent=2, sort_keys=True) + "\n", mode=0o644)
    return RenderedSite(view=view, files=files, failover=failover_budget(public["charon"] or "", swanctl, frr))


def hybrid_view(fleet: Fleet, site: str, outputs: Mapping[str, Any], *, source: str) -> HybridNodeView | None:
    """The join settings of a site's GPU machines, or None when the site has none (gpu_nodes: 0)."""
    spec = fleet.sites[site]
    if spec.gpu_nodes == 0:
        return None
    stack = stack_of(fleet, site)
    activations = require_output(outputs, "hybrid_activations", source=source, stack=stack)
    if not isinstance(activations, Mapping) or site not in activations:
        raise DlinfraError(
            f"hybrid_activations has no entry for {site}; run `pulumi up --stack {stack}` and export the outputs again",
            file=source,
            key="hybrid_activations",
        )
    activation = activations[site]
    try:
        return HybridNodeView(
            site=site,
            cluster_name=_unmasked(
                require_output(outputs, "cluster_name", source=source, stack=stack), "cluster_name", source
            ),
            region=spec.region,
            activation_id=_unmasked(activation.get("id"), f"hybrid_activations.{site}.id", source),
            activation_code=_unmasked(activation.get("code"), f"hybrid_activations.{site}.code", source),
            gpu_model=spec.gpu_model if spec.gpus_per_node else None,
            cluster_dns=_cluster_dns(outputs, source=source, stack=stack),
        )
    except ValueError as exc:
        raise DlinfraError(str(exc), file=source, key=f"hybrid_activations.{site}") from None


def _cluster_dns(outputs: Mapping[str, Any], *, source: str, stack: str) -> tuple[str, ...]:
    """The kubelet's DNS servers the regional stack exports (its NodeLocal DNS cache first, then kube-dns)."""
    value = require_output(outputs, "cluster_dns", source=source, stack=stack)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise DlinfraError(f"expected a list of addresses, got {value!r}", file=source, key="cluster_dns")
    return tuple(value)


def gpu_node_json(fleet: Fleet, site: str, *, install_dir: str) -> dict[str, Any]:
    """Chef node JSON for the site's GPU machines (role site-gpu-node); the NodeConfig holds the secret."""
    spec = fleet.sites[site]
    return {
        "run_list": ["role[site-gpu-node]"],
        "dlinfra_hybrid": {
            "kubernetes_version": fleet.environments[spec.environment].kubernetes.version,
            "credential_provider": "ssm",
            "node_config_source": f"{install_dir}/nodeadm.yaml",
            "nfs_mounts": [
                {"server": str(m.server), "export": m.export, "mount_point": m.mount_point} for m in spec.nfs
            ],
        },
    }


def next_steps_after_add(fleet: Fleet, site: str, fleet_path: Path) -> list[str]:
    """The commands that bring a newly added site up, in order."""
    spec = fleet.sites[site]
    home = stack_of(fleet, site)
    steps = [
        f"review and commit {fleet_path.name} and the lock",
        f"pulumi up --stack {home}    # customer gateway, VPN connection, routes in {spec.region}",
    ]
    if len(fleet.environments[spec.environment].regions) > 1:
        steps.append(f"pulumi up --stack {spec.environment}-global    # the other regions route to {site}")
    steps += [
        f"pulumi stack output --json --show-secrets --stack {home} > {home}.outputs.json",
        f"dlinfra site render {site} --outputs {home}.outputs.json    # swanctl.conf, frr.conf, node JSON",
        f"shred -u {home}.outputs.json    # it holds the tunnels' pre-shared keys",
    ]
    return steps


# What the operator runs after `site render`. docs/site-onboarding.md shows these same commands (a test keeps
# them equal), run on each machine from the directory the rendered files were copied to.
ONBOARDING_GUIDE = "docs/site-onboarding.md"
# Where the site machines keep a copy of chef/ (chef/README.md, "Converging a site machine").
CHEF_REPO_DIR = "/var/lib/dlinfra/chef"


@dataclass(frozen=True)
class InstallStep:
    """Commands for one kind of machine, in the order they run."""

    where: str  # on the gateway, on each GPU machine, ...
    commands: tuple[str, ...]


def install_steps(files: Mapping[str, Path], *, install_dir: str = DEFAULT_INSTALL_DIR) -> list[InstallStep]:
    """The commands that install what `site render` wrote (files: role -> path) and check each machine."""

    def converge(node_json: Path) -> str:
        return (
            f"sudo cinc-client --local-mode --chef-repo-path {CHEF_REPO_DIR} "
            f"--json-attributes {install_dir}/{node_json.name}"
        )

    # The gateway gets only its own files: the NodeConfig's activation code stays off it, and the tunnels'
    # keys off the GPU machines.
    roles = ("swanctl", *GATEWAY_FILES, "node")
    gateway_files = [files[role].name for role in roles if role in files]
    gateway = [
        f"sudo install -d -m 0700 {install_dir}",
        f"sudo install -m 0600 -t {install_dir} {' '.join(gateway_files)}",
        converge(files["node"]),
        "sudo swanctl --list-sas",
    ]
    if "xfrm" in files:
        # Route-based: the tunnel interfaces, up with their inside addresses, and the routes over both.
        gateway += ["ip -d link show type xfrm", "ip route show"]
    if "frr" in files:
        gateway.append("sudo vtysh -c 'show bgp summary'")
    steps = [InstallStep("on the site gateway", tuple(gateway))]
    if "nodeadm" in files:
        steps.append(
            InstallStep(
                "on each GPU machine",
                (
                    f"sudo install -d -m 0700 {install_dir}",
                    f"sudo install -m 0600 -t {install_dir} {files['nodeadm'].name} {files['gpu-node'].name}",
                    converge(files["gpu-node"]),
                ),
            )
        )
        steps.append(
            InstallStep(
                "from a workstation with cluster access",
                ("kubectl get nodes -l eks.amazonaws.com/compute-type=hybrid -o wide",),
            )
        )
    return steps
