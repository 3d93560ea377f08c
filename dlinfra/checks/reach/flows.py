"""The user's own flows: a flows file beside the fleet (docs/reachability.md), read into intents."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dlinfra.checks.reach.endpoints import INTERNET, laptop_endpoints, place_endpoints, site_endpoint
from dlinfra.checks.reach.engine import Endpoint, PortRange
from dlinfra.checks.reach.intents import Expect, Intent
from dlinfra.checks.reach.topology import Topology
from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.load import parse_yaml
from dlinfra.model.fleet.schema import Fleet


class _Selector(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    environment: str | None = None  # default: every environment
    region: str | None = None  # default: every region of the environment
    pool: str | None = None  # a node pool's pods
    control_plane: bool = False  # the EKS API
    efs: bool = False
    fsx: bool = False
    endpoint: str | None = None  # an interface endpoint's service, e.g. sts
    ci_runner: bool = False
    instance: str | None = None  # an EC2 instance by its logical name
    site: str | None = None
    network: Literal["lan", "pods"] = "lan"  # with site
    vpn_team: str | None = None  # laptops of a team (federated VPN), or "*" for certificate users
    internet: bool = False


class _Flow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    from_: _Selector = Field(alias="from")
    to: _Selector
    protocol: Literal["tcp", "udp", "icmp"] = "tcp"
    ports: tuple[int | str, ...] = ()  # 443, or "1018-1023"; required for tcp and udp
    source_ports: tuple[int | str, ...] = ()  # default: the source's ephemeral ports
    expect: Expect = "allow"
    why: str = ""  # where the requirement comes from


class _FlowsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flows: list[_Flow] = Field(default_factory=list)


def load_flows(path: Path, fleet: Fleet, topo: Topology) -> list[Intent]:
    """Intents from a flows file (docs/reachability.md); one clear error naming the file and key."""
    data = parse_yaml(path) or {}
    try:
        spec = _FlowsFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise DlinfraError(f"{err['msg']}", file=str(path), key=key) from None
    out = []
    for index, flow in enumerate(spec.flows):
        key = f"flows.{index}"
        sources = _select(flow.from_, fleet, topo, str(path), f"{key}.from")
        destinations = _select(flow.to, fleet, topo, str(path), f"{key}.to")
        if flow.protocol == "icmp" and (flow.ports or flow.source_ports):
            raise DlinfraError("icmp has no ports; leave ports out", file=str(path), key=f"{key}.ports")
        if flow.protocol != "icmp" and not flow.ports:
            raise DlinfraError(
                f"a {flow.protocol} flow needs its destination ports (e.g. ports: [443] or ['1018-1023'])",
                file=str(path),
                key=f"{key}.ports",
            )
        ports = _ranges(flow.ports, str(path), f"{key}.ports", low=1)
        source_ports = _ranges(flow.source_ports, str(path), f"{key}.source_ports", low=0) or None
        out.append(
            Intent(
                f"user/{flow.name}",
                "user",
                flow.name,
                "",
                sources,
                destinations,
                flow.protocol,
                ports if flow.protocol != "icmp" else ((0, 0),),
                flow.expect,
                flow.why or f"{path.name}: {flow.name}",
                source_ports,
            )
        )
    return out


def _ranges(values: tuple[int | str, ...], file: str, key: str, *, low: int) -> tuple[PortRange, ...]:
    """Ports and ranges ("1018-1023") as ranges, each within low..65535."""
    out = []
    for value in values:
        text = str(value).strip()
        first, _, last = text.partition("-")
        try:
            a, b = int(first), int(last or first)
        except ValueError:
            raise DlinfraError(f"{text!r} is not a port or a range like 1018-1023", file=file, key=key) from None
        if not low <= a <= b <= 65535:
            raise DlinfraError(f"port {text} is not in {low}-65535 (low to high)", file=file, key=key)
        out.append((a, b))
    return tuple(out)


def _select(sel: _Selector, fleet: Fleet, topo: Topology, file: str, key: str) -> tuple[Endpoint, ...]:
    kinds = [
        k
        for k, v in (
            ("pool", sel.pool),
            ("control-plane", sel.control_plane),
            ("efs", sel.efs),
            ("fsx", sel.fsx),
            ("endpoint", sel.endpoint),
            ("ci-runner", sel.ci_runner),
            ("instance", sel.instance),
            ("site", sel.site),
            ("vpn", sel.vpn_team),
            ("internet", sel.internet),
        )
        if v
    ]
    if len(kinds) != 1:
        raise DlinfraError(
            "give exactly one of pool, control_plane, efs, fsx, endpoint, ci_runner, instance, site, vpn_team, "
            "internet",
            file=file,
            key=key,
        )
    if sel.environment is not None and sel.environment not in fleet.environments:
        raise DlinfraError(f"unknown environment {sel.environment!r}", file=file, key=f"{key}.environment")
    kind = kinds[0]
    if kind == "internet":
        if sel.environment or sel.region:
            raise DlinfraError("the internet has no environment or region", file=file, key=key)
        return (INTERNET,)
    if kind == "site":
        site = topo.sites.get(str(sel.site))
        if site is None:
            raise DlinfraError(f"unknown site {sel.site!r}", file=file, key=f"{key}.site")
        if sel.environment is not None and sel.environment != site.environment:
            raise DlinfraError(
                f"site {site.name} is in environment {site.environment!r}, not {sel.environment!r}",
                file=file,
                key=f"{key}.environment",
            )
        if sel.region is not None and sel.region != site.region:
            raise DlinfraError(
                f"site {site.name}'s home region is {site.region!r}, not {sel.region!r}", file=file, key=f"{key}.region"
            )
        return (site_endpoint(site, sel.network),)
    envs = [sel.environment] if sel.environment else sorted(fleet.environments)
    if kind == "vpn":
        found = tuple(
            laptop
            for env in envs
            for region, laptop in laptop_endpoints(topo, fleet, env)
            if (sel.region is None or region == sel.region)
            and (sel.vpn_team == "*" or f"team {sel.vpn_team}" in laptop.label)
        )
    else:
        name = sel.pool or sel.endpoint or sel.instance
        found = tuple(
            e
            for p in topo.places
            if p.kind == kind
            and p.environment in envs
            and (sel.region is None or p.region == sel.region)
            and (name is None or p.name == name)
            for e in place_endpoints(topo, p)
        )
    if not found:
        raise DlinfraError(f"selects nothing the plans declare ({kind})", file=file, key=key)
    return found
