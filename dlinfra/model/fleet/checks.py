"""Checks of a fleet that span several entries (regions, environments, pools, sites, teams): each problem is a
FleetError naming the key. Address overlaps need the lock too and live in dlinfra.model.planner."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence

from dlinfra.errors import FleetError
from dlinfra.model import eks, gpu_health
from dlinfra.model.fleet.pools import CapacityReservation, NodePool
from dlinfra.model.fleet.schema import (
    RESERVED_NAMESPACES,
    Environment,
    Fleet,
    is_rfc1918,
)
from dlinfra.model.regions import known_regions, region_of_zone

# The laptop VPN's authorization rules for saml.admin_group go by this name beside the teams' (stacks/regional.py).
ADMINS_ACCESS_KEY = "admins"
# A site's machines carry dlinfra.io/pool = its Kueue flavor's name, site-<site> (dlinfra.model.kueue.site_flavor,
# dlinfra/render/nodeadm.py site_pool); a fleet pool of that name would share their label.
SITE_POOL_PREFIX = "site-"
# Hybrid nodes take one pod block each (Cilium's maskSize; dlinfra.model.hybrid_routing.NODE_POD_PREFIX says why /25).
_NODE_POD_PREFIX = 25


def _cross_checks(fleet: Fleet) -> Iterator[FleetError]:
    """Checks that span several entries; each yields an error naming the key."""
    known = known_regions()
    for name, spec in fleet.regions.items():
        if name not in known:
            yield FleetError(f"unknown region {name!r}; known: {', '.join(sorted(known))}", key=f"regions.{name}")
            return
        if spec.azs > len(known[name].azs):
            yield FleetError(
                f"{spec.azs} AZs asked for, but {name} has {len(known[name].azs)} ({', '.join(known[name].azs)})",
                key=f"regions.{name}.azs",
            )
        else:
            yield from _eks_zone_checks(fleet, name)
    primaries = [n for n, s in fleet.regions.items() if s.primary]
    if len(primaries) != 1:
        yield FleetError(f"exactly one region must be primary, found {primaries or 'none'}", key="regions")
    for env_name, env in fleet.environments.items():
        version_problem = eks.version_problem(env.kubernetes.version)
        if version_problem:
            yield FleetError(version_problem, key=f"environments.{env_name}.kubernetes.version")
        saml = env.client_vpn.saml if env.client_vpn else None
        if saml is not None and saml.admin_group is None and not any(t.vpn_group for t in fleet.teams.values()):
            yield FleetError(
                "federated sign-in authorizes by group, but no team has a vpn_group and there is no admin_group: "
                "nobody could reach anything",
                key=f"environments.{env_name}.client_vpn.saml",
            )
        if env.kubernetes.upgrade_policy is None:
            yield FleetError(
                "required: say `standard` (EKS upgrades the cluster when standard support ends) or `extended` "
                "(12 more months of paid support)",
                key=f"environments.{env_name}.kubernetes.upgrade_policy",
            )
        for region in env.regions:
            if region not in fleet.regions:
                yield FleetError(
                    f"region {region!r} is not in the fleet's regions ({', '.join(fleet.regions)})",
                    key=f"environments.{env_name}.regions.{region}",
                )
        if env.ci is not None:
            for field in ("apply_role_arn", "preview_role_arn"):
                arn = getattr(env.ci, field)
                if arn in env.kubernetes.admin_role_arns:
                    yield FleetError(
                        f"{arn} is also in kubernetes.admin_role_arns: EKS gives a principal one access entry; use "
                        "a role of its own for CI",
                        key=f"environments.{env_name}.ci.{field}",
                    )
        yield from _pool_checks(fleet, env_name, env)
        yield from _shared_resource_checks(env_name, env)
    yield from _site_checks(fleet)
    for site_name, site in fleet.sites.items():
        key = f"sites.{site_name}"
        if site.environment not in fleet.environments:
            yield FleetError(f"unknown environment {site.environment!r}", key=f"{key}.environment")
        elif site.region not in fleet.environments[site.environment].regions:
            yield FleetError(
                f"home region {site.region!r} is not a region of environment {site.environment!r} "
                f"({', '.join(fleet.environments[site.environment].regions)})",
                key=f"{key}.region",
            )
        else:
            if site.asn in known[site.region].reserved_asns:
                yield FleetError(f"ASN {site.asn} is reserved by AWS in {site.region}", key=f"{key}.asn")
            tgw_asn = fleet.environments[site.environment].regions[site.region].transit_asn
            if site.asn == tgw_asn:
                yield FleetError(
                    f"ASN {site.asn} is the home transit gateway's own ASN; pick another for the site",
                    key=f"{key}.asn",
                )
        for field in ("lan", "pod_cidr"):
            net = getattr(site, field)
            if net is not None and not is_rfc1918(net):
                yield FleetError(f"{net} is not inside an RFC 1918 range", key=f"{key}.{field}")
    for env_name, env in fleet.environments.items():
        for region, env_region in env.regions.items():
            for field in ("vpc_cidr", "client_vpn_cidr"):
                net = getattr(env_region, field)
                if net is not None and not is_rfc1918(net):
                    yield FleetError(
                        f"{net} is not inside an RFC 1918 range",
                        key=f"environments.{env_name}.regions.{region}.{field}",
                    )
            if env_region.vpc_cidr is not None and not 16 <= env_region.vpc_cidr.prefixlen <= 28:
                yield FleetError(
                    f"{env_region.vpc_cidr} is a /{env_region.vpc_cidr.prefixlen}; AWS VPCs are /16 to /28",
                    key=f"environments.{env_name}.regions.{region}.vpc_cidr",
                )
            cvpn = env_region.client_vpn_cidr
            if cvpn is not None and not 12 <= cvpn.prefixlen <= 22:
                yield FleetError(
                    f"{cvpn} is a /{cvpn.prefixlen}; Client VPN needs /12 to /22",
                    key=f"environments.{env_name}.regions.{region}.client_vpn_cidr",
                )
    for team, team_spec in fleet.teams.items():
        if team.endswith("-overflow"):
            yield FleetError(
                "team names may not end in -overflow: a team's overflow ClusterQueue is named <team>-overflow",
                key=f"teams.{team}",
            )
        for region in team_spec.overflow:
            key = f"teams.{team}.overflow"
            if region not in fleet.regions:
                yield FleetError(f"{region!r} is not a region of the fleet ({', '.join(fleet.regions)})", key=key)
            elif region == fleet.primary_region:
                yield FleetError(
                    f"{region} is the primary region, whose cluster dispatches overflowing jobs (the MultiKueue "
                    "manager); list the regions jobs may overflow to",
                    key=key,
                )
    yield from _team_references(fleet)
    namespaces: dict[str, str] = {}
    for team in fleet.teams:
        ns = fleet.team_namespace(team)
        if ns in RESERVED_NAMESPACES:
            yield FleetError(f"namespace {ns!r} belongs to the cluster; choose another", key=f"teams.{team}.namespace")
        if ns in namespaces:
            yield FleetError(f"namespace {ns!r} is also team {namespaces[ns]!r}'s", key=f"teams.{team}.namespace")
        namespaces[ns] = team
    # A job operator's namespace is trusted to make GPU pods outside the queues (dlinfra.model.job_operators): a
    # team's own namespace must never be one.
    for env_name, env in fleet.environments.items():
        for operator, ns in env.kubernetes.job_operators.items():
            if ns in namespaces:
                yield FleetError(
                    f"namespace {ns!r} is team {namespaces[ns]!r}'s: its members could then make GPU pods and jobs "
                    "that bypass Kueue; install the operator in a namespace of its own",
                    key=f"environments.{env_name}.kubernetes.job_operators.{operator}",
                )


def _eks_zone_checks(fleet: Fleet, region: str) -> Iterator[FleetError]:
    """Every region runs an EKS cluster on the private subnets of all its AZs: none may be in a zone EKS refuses."""
    refused = eks.unsupported_zone_ids(region)
    for i, az in enumerate(fleet.azs(region)):
        zone = fleet.zone_id(region, az)
        if zone in refused:
            yield FleetError(
                f"the first {fleet.regions[region].azs} AZs of {region} include {az}, zone {zone}, where EKS cannot "
                f"place a cluster's subnets (dlinfra/data/eks.yaml unsupported_zone_ids): use at most {i}",
                key=f"regions.{region}.azs",
            )
            return


def _team_references(fleet: Fleet) -> Iterator[FleetError]:
    """A team's overflow regions have clusters, and its IAM role and IdP group are its own: every cluster gives an
    access entry to each team's role, and every federated laptop VPN an authorization rule to each team's group."""
    in_environments = {region for env in fleet.environments.values() for region in env.regions}
    for team, spec in fleet.teams.items():
        for region in spec.overflow:
            if region in fleet.regions and region not in in_environments:
                yield FleetError(
                    f"{region} is in no environment's regions: there is no cluster there for jobs to overflow to",
                    key=f"teams.{team}.overflow",
                )
    # EKS: "An IAM principal can't be included in more than one access entry" (EKS guide "Create access entries").
    # Teams' roles get an entry in every environment's cluster, beside its admins' and CI's.
    principals: dict[str, str] = {}
    for env_name, env in fleet.environments.items():
        for arn in env.kubernetes.admin_role_arns:
            principals.setdefault(arn, f"in environments.{env_name}.kubernetes.admin_role_arns")
        if env.ci is not None:
            for field in ("apply_role_arn", "preview_role_arn"):
                principals.setdefault(getattr(env.ci, field), f"environments.{env_name}.ci.{field}")
    for team, spec in fleet.teams.items():
        if spec.role_arn is None:
            continue
        other = principals.setdefault(spec.role_arn, f"team {team}'s role")
        if other != f"team {team}'s role":
            yield FleetError(
                f"{spec.role_arn} is also {other}: EKS gives an IAM principal one access entry per cluster, so the "
                "team needs a role of its own",
                key=f"teams.{team}.role_arn",
            )
    # Client VPN authorization rules are one per destination and group (terraform-provider-aws
    # ec2/vpnclient_authorization_rule.go: the rule's id is endpoint, CIDR and group): two names for one group
    # would declare the same rule twice, and removing either would revoke the other's access.
    saml_admins = {
        env.client_vpn.saml.admin_group: env_name
        for env_name, env in fleet.environments.items()
        if env.client_vpn is not None and env.client_vpn.saml is not None and env.client_vpn.saml.admin_group
    }
    groups: dict[str, str] = {}
    for team, spec in fleet.teams.items():
        key = f"teams.{team}"
        if team == ADMINS_ACCESS_KEY and saml_admins:
            yield FleetError(
                f"the laptop VPN names its admin_group's rules {ADMINS_ACCESS_KEY!r} (environments."
                f"{next(iter(saml_admins.values()))}.client_vpn.saml.admin_group); give the team another name",
                key=key,
            )
        if spec.vpn_group is None:
            continue
        if spec.vpn_group in saml_admins:
            yield FleetError(
                f"{spec.vpn_group} is environments.{saml_admins[spec.vpn_group]}.client_vpn.saml.admin_group too: "
                "one group's rules would be declared twice; give the team its own IdP group",
                key=f"{key}.vpn_group",
            )
        other = groups.setdefault(spec.vpn_group, team)
        if other != team:
            yield FleetError(
                f"{spec.vpn_group} is also team {other}'s vpn_group; each team needs its own IdP group",
                key=f"{key}.vpn_group",
            )


def _site_checks(fleet: Fleet) -> Iterator[FleetError]:
    """What `site add` refuses, refused in the file too: shared gateways, ASNs that clash, pod ranges too small."""
    gateways: dict[str, str] = {}
    asns: dict[tuple[str, int], str] = {}
    for name, site in fleet.sites.items():
        key = f"sites.{name}"
        # Every GPU machine runs the burn-in, whose expectation comes from the GPU model table.
        if site.gpu_nodes and site.gpus_per_node and site.gpu_model not in gpu_health.table().models:
            known = ", ".join(sorted(gpu_health.table().models))
            yield FleetError(
                f"{site.gpu_model!r} is not a GPU model dlinfra can check before the machines take work "
                f"({gpu_health.TABLE_PATH} knows {known})",
                key=f"{key}.gpu_model",
            )
        elif site.gpu_nodes and site.gpus_per_node:
            try:
                gpu_health.site_product(site.gpu_model, site.gpu_product)
            except ValueError as exc:
                yield FleetError(str(exc), key=f"{key}.gpu_product")
        other = gateways.setdefault(str(site.public_ip), name)
        if other != name:
            yield FleetError(
                f"{site.public_ip} is already the gateway of site {other!r}; each site needs its own customer gateway "
                "address",
                key=f"{key}.public_ip",
            )
        # Sites of one environment meet through its transit gateways: BGP drops routes whose AS path holds the
        # receiver's own ASN, so two sites in one ASN would never learn each other's networks.
        other = asns.setdefault((site.environment, site.asn), name)
        if other != name:
            yield FleetError(
                f"ASN {site.asn} is already used by site {other!r} in environment {site.environment!r}; give each "
                "site its own",
                key=f"{key}.asn",
            )
        env = fleet.environments.get(site.environment)
        for region, env_region in (env.regions if env else {}).items():
            if site.asn == env_region.transit_asn and region != site.region:  # the home one is reported below
                yield FleetError(
                    f"ASN {site.asn} is the transit gateway ASN of {site.environment}/{region}; pick another",
                    key=f"{key}.asn",
                )
        prefix = site.pod_cidr.prefixlen if site.pod_cidr is not None else fleet.address_space.hybrid_pod_prefix
        where = f"{key}.pod_cidr" if site.pod_cidr is not None else "address_space.hybrid_pod_prefix"
        if prefix > _NODE_POD_PREFIX:
            yield FleetError(
                f"a /{prefix} pod range is smaller than one hybrid node's /{_NODE_POD_PREFIX} pod block", key=where
            )
        elif site.gpu_nodes > (blocks := 2 ** (_NODE_POD_PREFIX - prefix)):
            yield FleetError(
                f"a /{prefix} pod range holds {blocks} nodes' /{_NODE_POD_PREFIX} pod blocks, but site {name} has "
                f"gpu_nodes: {site.gpu_nodes}",
                key=where,
            )


def _pool_checks(fleet: Fleet, env_name: str, env: Environment) -> Iterator[FleetError]:
    for pool_name, pool in env.node_pools.items():
        key = f"environments.{env_name}.node_pools.{pool_name}"
        if pool_name.startswith(SITE_POOL_PREFIX):
            yield FleetError(
                f"pool names beginning {SITE_POOL_PREFIX!r} are the sites' (their machines' dlinfra.io/pool label, "
                f"dlinfra/render/nodeadm.py): rename the pool",
                key=key,
            )
            return
        for region in pool.regions or ():
            if region not in env.regions:
                yield FleetError(f"region {region!r} is not a region of environment {env_name!r}", key=f"{key}.regions")
                return
        yield from _instance_checks(key, pool)
        yield from _sharing_checks(key, pool)
        used = pool.regions or tuple(env.regions)
        yield from _offering_checks(key, pool, [r for r in used if r not in pool.capacity_reservations])
        for region, zones in pool.zones.items():
            if region not in used:
                yield FleetError(f"pool does not run in {region!r}", key=f"{key}.zones.{region}")
                return
            for zone in zones:
                problem = _zone_problem(fleet, region, zone)
                if problem:
                    yield FleetError(problem, key=f"{key}.zones.{region}")
                    return
            reserved = pool.capacity_reservations.get(region)
            if pool.efa and len(zones) != 1:
                yield FleetError(
                    f"an EFA pool lives in one AZ (one cluster placement group); got {len(zones)}: {', '.join(zones)}",
                    key=f"{key}.zones.{region}",
                )
            elif reserved is not None and reserved.placement_group and len(zones) != 1:
                # The pool launches into the reservation's cluster placement group, which lies in one AZ: an Auto
                # Scaling group cannot name several AZs and a cluster placement group (EC2 guide, "Placement groups";
                # Auto Scaling API reference, CreateAutoScalingGroup PlacementGroup).
                yield FleetError(
                    f"reservation {reserved.id} was made in cluster placement group {reserved.placement_group!r}, "
                    f"which lies in one AZ; the pool launches into it, so it takes one zone, got {len(zones)}: "
                    f"{', '.join(zones)}",
                    key=f"{key}.zones.{region}",
                )
        for region, cr in pool.capacity_reservations.items():
            if region not in used:
                yield FleetError(f"pool does not run in {region!r}", key=f"{key}.capacity_reservations.{region}")
                return
            yield from _reservation_zone_checks(
                fleet, f"{key}.capacity_reservations.{region}.zone_id", region, pool, cr
            )


def _reservation_zone_checks(
    fleet: Fleet, key: str, region: str, pool: NodePool, cr: CapacityReservation
) -> Iterator[FleetError]:
    """A reservation's zone id is a zone of its region that the fleet uses there, and the pool's zone."""
    az = known_regions()[region].az_of(cr.zone_id) if region in known_regions() else None
    ours = {fleet.zone_id(region, a): a for a in fleet.azs(region)} if region in fleet.regions else {}
    where = ", ".join(f"{a} ({z})" for z, a in ours.items())
    if az is None:
        home = region_of_zone(cr.zone_id)
        elsewhere = f"it is a zone of {home}" if home else "no region dlinfra knows has it (dlinfra/data/regions.yaml)"
        yield FleetError(f"reservation {cr.id}: {cr.zone_id} is not a zone of {region}: {elsewhere}", key=key)
    elif cr.zone_id not in ours:
        refused = " (EKS cannot use it for the cluster)" if cr.zone_id in eks.unsupported_zone_ids(region) else ""
        yield FleetError(
            f"reservation {cr.id} is in {cr.zone_id}{refused}, not among the zones the fleet uses in {region}: {where}",
            key=key,
        )
    elif region in pool.zones and az not in pool.zones[region]:
        yield FleetError(
            f"reservation {cr.id} is in {cr.zone_id} ({az}) but the pool runs in {', '.join(pool.zones[region])}",
            key=key,
        )


def _zone_problem(fleet: Fleet, region: str, zone: str) -> str | None:
    """Why `zone` cannot be one of the fleet's AZs in `region` (it belongs to another region, is beyond the
    region's `azs`, or is no AZ at all), or None when it is one."""
    used = fleet.azs(region)
    if zone in used:
        return None
    if zone in known_regions()[region].azs:
        return (
            f"{zone} is not among the {len(used)} AZs the fleet uses in {region} ({', '.join(used)}); raise "
            f"regions.{region}.azs or pick one of those"
        )
    home = next((name for name, spec in known_regions().items() if zone in spec.azs), None)
    if home is not None:
        return f"{zone} is an AZ of {home}, not of {region}; the AZs the fleet uses in {region}: {', '.join(used)}"
    return f"{zone} is not an AZ of {region}; the AZs the fleet uses there: {', '.join(used)}"


def _instance_checks(key: str, pool: NodePool) -> Iterator[FleetError]:
    """Instance types exist, match the pool's kind, and support EFA when the pool asks for it."""
    from dlinfra.model import instances  # the table is only read when a fleet has pools

    for i, name in enumerate(pool.instance_types):
        where = f"{key}.instance_types[{i}]"
        try:
            spec = instances.lookup(name)
        except instances.UnknownInstanceType as exc:
            yield FleetError(str(exc), key=where)
            continue
        if pool.kind == "gpu" and spec.gpus == 0:
            yield FleetError(f"{name} has no GPU; a GPU pool takes GPU instance types only", key=where)
        if pool.kind == "cpu" and spec.gpus > 0:
            yield FleetError(f"{name} is a GPU type ({spec.gpus} x {spec.gpu_model}); use a GPU pool", key=where)
        if pool.efa and not spec.efa_supported:
            yield FleetError(f"{name} does not support EFA; drop efa or pick an EFA-capable type", key=where)
    if pool.efa and len(pool.instance_types) > 1:
        yield FleetError("an EFA pool uses one instance type (one EFA layout)", key=f"{key}.instance_types")


def _sharing_checks(key: str, pool: NodePool) -> Iterator[FleetError]:
    """A MIG pool has one GPU product, and its layout fits that GPU (dlinfra.model.gpu_sharing)."""
    from dlinfra.model import gpu_sharing, instances

    sharing = pool.gpu_sharing
    if sharing is None or sharing.mig is None:
        return
    try:
        specs = [instances.lookup(t) for t in pool.instance_types]
    except instances.UnknownInstanceType:
        return  # reported by _instance_checks
    products = sorted({(s.gpu_model, s.gpu_product) for s in specs if s.gpus}, key=str)
    if len(products) != 1:
        # One layout for every node: the autoscaler's template and Kueue's flavor count one set of shares.
        found = ", ".join(f"{t} ({s.gpu_product})" for t, s in zip(pool.instance_types, specs, strict=True))
        yield FleetError(
            f"a MIG pool's instance types must have one GPU product, so that every node has the same MIG instances; "
            f"got {found}",
            key=f"{key}.instance_types",
        )
        return
    gpu_model, product = products[0]
    if gpu_model is None or product is None:
        return  # a CPU type: reported by _instance_checks
    known = gpu_sharing.profiles(gpu_model, product) or {}
    for profile in sharing.mig:
        if known and profile not in known:
            yield FleetError(
                f"{product} has no MIG profile {profile!r}; its profiles ({gpu_sharing.TABLE_PATH}): "
                f"{', '.join(known)}",
                key=f"{key}.gpu_sharing.mig.{profile}",
            )
            return
    problem = gpu_sharing.layout_problem(sharing.mig, gpu_model, product)
    if problem:
        yield FleetError(problem, key=f"{key}.gpu_sharing.mig")


def _shared_resource_checks(env_name: str, env: Environment) -> Iterator[FleetError]:
    """Kueue counts each resource in one resource group of a ClusterQueue, whose flavors all cover the same resources
    (Kueue docs, "Cluster Queue": resource groups): two shared pools of an environment offer the same resources or
    none in common."""
    from dlinfra.model import gpu_sharing

    seen: dict[str, tuple[str, frozenset[str]]] = {}
    for pool_name, pool in env.node_pools.items():
        if pool.gpu_sharing is None:
            continue
        offered = frozenset(gpu_sharing.per_gpu(pool.gpu_sharing))
        for resource in sorted(offered):
            other = seen.setdefault(resource, (pool_name, offered))
            if other[1] != offered:
                yield FleetError(
                    f"offers {', '.join(sorted(offered))}, pool {other[0]} offers {', '.join(sorted(other[1]))}: "
                    f"Kueue counts {resource} in one resource group, whose flavors cover the same resources; give "
                    "both the same MIG profiles or none in common",
                    key=f"environments.{env_name}.node_pools.{pool_name}.gpu_sharing",
                )
                return


def _offering_checks(key: str, pool: NodePool, regions: Sequence[str]) -> Iterator[FleetError]:
    """In every region a pool runs in, at least one of its types is sold there."""
    from dlinfra.model import instances

    try:
        specs = [instances.lookup(t) for t in pool.instance_types]
    except instances.UnknownInstanceType:
        return  # reported by _instance_checks
    for region in sorted(regions):
        if not any(s.offered_in is None or region in s.offered_in for s in specs):
            types = ", ".join(pool.instance_types)
            yield FleetError(
                f"none of {types} is sold in {region} (offered_in, {instances.TABLE_PATH}): add a type sold there "
                "or leave the region out of the pool's regions",
                key=f"{key}.instance_types",
            )


# How far ahead `validate` warns of a Capacity Block's end, by default (`--warn-within`): two weeks is the longest
# block sold in 1-day steps, and time to buy or extend the next ("Extend Capacity Blocks": up to 56 days before).
BLOCK_WARN_DAYS = 14
# EC2 terminates a Capacity Block's instances this long before its end ("Work with Capacity Blocks").
BLOCK_CUT = datetime.timedelta(minutes=30)


def block_warnings(fleet: Fleet, now: datetime.datetime, within: datetime.timedelta) -> list[tuple[str, str]]:
    """(key, message) for each Capacity Block whose window ends within `within` of `now`, or has ended.

    Time-dependent, so never part of the plan: the CLI calls it with the clock (tests pin DLINFRA_TODAY).
    """
    warnings: list[tuple[str, str]] = []
    for env_name, env in sorted(fleet.environments.items()):
        for pool_name, pool in sorted(env.node_pools.items()):
            for region, cr in sorted(pool.capacity_reservations.items()):
                window = cr.block_window()
                if window is None:
                    continue
                _, block_end = window
                key = f"environments.{env_name}.node_pools.{pool_name}.capacity_reservations.{region}.end"
                end = f"{block_end:%Y-%m-%d %H:%M} UTC"
                if block_end - BLOCK_CUT <= now:
                    warnings.append(
                        (
                            key,
                            f"Capacity Block {cr.id} ended {end} (its instances went 30 minutes before): pool "
                            f"{pool_name} can never launch in {region} again (its keeper holds the group at 0, and "
                            "its Kueue flavor closed: jobs run on other flavors or overflow); extend the block and "
                            "give its new end, or remove it from the fleet",
                        )
                    )
                elif block_end - now <= within:
                    left = block_end - BLOCK_CUT - now
                    hours = int(left.total_seconds() // 3600)
                    warnings.append(
                        (
                            key,
                            f"Capacity Block {cr.id} ends {end}: pool {pool_name}'s nodes in {region} go in "
                            f"{hours // 24} d {hours % 24} h (EC2 terminates them 30 minutes before the end, and "
                            'the pool drains earlier still); extend the block ("Extend Capacity Blocks") or '
                            "plan for its end",
                        )
                    )
    return warnings


def check(fleet: Fleet) -> None:
    """Raise the first problem that spans several entries, as a FleetError naming the key."""
    for problem in _cross_checks(fleet):
        raise problem
