"""The network model read from plan exports (`build`), and each site's gateway from the fleet (`site_sides`).

Pure: reads `dlinfra.plan/v1` dicts (docs/plan-export.md), no Pulumi.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dlinfra.checks.reach.refused import ipv6_setting
from dlinfra.checks.reach.topology import (
    Attachment,
    AuthRule,
    ClientVpn,
    NaclRule,
    Nat,
    Net,
    NetworkAcl,
    Place,
    Resource,
    Route,
    RouteTable,
    RouteTarget,
    SecurityGroup,
    SgRule,
    SiteSide,
    Subnet,
    TgwRoute,
    TgwRouteTable,
    Topology,
    TransitGateway,
    Vpc,
)
from dlinfra.model.dev_boxes import DEV_BOX_TAG
from dlinfra.model.regions import known_regions

# Types the model reads; anything else in a plan is not part of the network.
VPC = "aws:ec2/vpc:Vpc"
VPC_CIDR = "aws:ec2/vpcIpv4CidrBlockAssociation:VpcIpv4CidrBlockAssociation"
SUBNET = "aws:ec2/subnet:Subnet"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
ROUTE = "aws:ec2/route:Route"
RT_ASSOC = "aws:ec2/routeTableAssociation:RouteTableAssociation"
MAIN_RT_ASSOC = "aws:ec2/mainRouteTableAssociation:MainRouteTableAssociation"
IGW = "aws:ec2/internetGateway:InternetGateway"
NAT = "aws:ec2/natGateway:NatGateway"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
NACL = "aws:ec2/networkAcl:NetworkAcl"
NACL_RULE = "aws:ec2/networkAclRule:NetworkAclRule"
NACL_ASSOC = "aws:ec2/networkAclAssociation:NetworkAclAssociation"
TGW = "aws:ec2transitgateway/transitGateway:TransitGateway"
TGW_VPC = "aws:ec2transitgateway/vpcAttachment:VpcAttachment"
TGW_PEERING = "aws:ec2transitgateway/peeringAttachment:PeeringAttachment"
TGW_RT = "aws:ec2transitgateway/routeTable:RouteTable"
TGW_ASSOC = "aws:ec2transitgateway/routeTableAssociation:RouteTableAssociation"
TGW_PROP = "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation"
TGW_ROUTE = "aws:ec2transitgateway/route:Route"
VPN = "aws:ec2/vpnConnection:VpnConnection"
VPN_ROUTE = "aws:ec2/vpnConnectionRoute:VpnConnectionRoute"
CVPN = "aws:ec2clientvpn/endpoint:Endpoint"
CVPN_ASSOC = "aws:ec2clientvpn/networkAssociation:NetworkAssociation"
CVPN_ROUTE = "aws:ec2clientvpn/route:Route"
CVPN_AUTH = "aws:ec2clientvpn/authorizationRule:AuthorizationRule"
ASG = "aws:autoscaling/group:Group"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EKS = "aws:eks/cluster:Cluster"
EFS_MOUNT = "aws:efs/mountTarget:MountTarget"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
CODEBUILD = "aws:codebuild/project:Project"
INSTANCE = "aws:ec2/instance:Instance"
DEFAULT_NACL = "aws:ec2/defaultNetworkAcl:DefaultNetworkAcl"
PREFIX_LIST = "aws:ec2/managedPrefixList:ManagedPrefixList"
PREFIX_LIST_ENTRY = "aws:ec2/managedPrefixListEntry:ManagedPrefixListEntry"
DEFAULT_RT = "aws:ec2/defaultRouteTable:DefaultRouteTable"
EIP = "aws:ec2/eip:Eip"
EIP_ASSOC = "aws:ec2/eipAssociation:EipAssociation"

SITE_LABEL = "dlinfra.io/site"


def _net(value: Any) -> Net | None:
    try:
        return ipaddress.IPv4Network(str(value)) if value else None
    except ValueError:
        return None


def _port(value: Any) -> int | None:
    return None if value is None else int(float(value))


def _protocol(value: Any) -> str:
    text = str(value).lower()
    return {"6": "tcp", "17": "udp", "1": "icmp", "all": "-1"}.get(text, text)


def _flag(value: Any) -> bool | None:
    """A provider boolean that may come as a string ("true", "false", "" for unset)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _as_list(value: Any) -> list[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        return [value]
    return [v for v in value or [] if isinstance(v, Mapping)]


def _ids(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    return tuple(str(v) for v in value if v)


def _tags(r: Mapping[str, Any]) -> Mapping[str, str]:
    return r["inputs"].get("tags") or {}


def build(plans: Iterable[Mapping[str, Any]], sites: Sequence[SiteSide] = ()) -> Topology:
    """The network model of a set of plan exports (usually every stack of one environment)."""
    topo = Topology()
    later: list[tuple[Mapping[str, Any], Resource, Mapping[str, Any], str, str]] = []
    for plan in plans:
        role = plan["role"]
        env, region = str(role.get("environment", "")), str(role.get("region") or "")
        for r in plan["resources"]:
            if not r.get("custom"):
                continue
            origin = Resource(plan["stack"], r["name"], r["urn"])
            later.append((r, origin, r["inputs"], env, region))
    for r, origin, i, _env, _region in later:
        if r["type"] == PREFIX_LIST:
            entries = [_net(e.get("cidr")) for e in i.get("entries") or []]
            topo.prefix_lists[str(r["id"])] = [n for n in entries if n]
            if None in entries:
                topo.unresolved.append((origin, "a prefix list entry whose CIDR the plan does not give"))
    for r, origin, i, _env, _region in later:
        if r["type"] == PREFIX_LIST_ENTRY and str(i.get("prefixListId")) in topo.prefix_lists:
            net = _net(i.get("cidr"))
            if net:
                topo.prefix_lists[str(i["prefixListId"])].append(net)
            else:
                topo.unresolved.append((origin, "a prefix list entry whose CIDR the plan does not give"))
    # Containers first (VPCs, groups, tables, gateways), then what refers to them.
    for r, origin, i, env, region in later:
        _containers(topo, r, origin, i, env, region)
        declared = ipv6_setting(r)
        if declared:
            topo.ipv6.append((origin, declared))
        if r["type"] in (EIP, EIP_ASSOC):
            topo.public_ips.update(
                v
                for v in (
                    i.get("instance"),
                    i.get("instanceId"),
                    i.get("networkInterface"),
                    i.get("networkInterfaceId"),
                )
                if v
            )
    for r, origin, i, env, region in later:
        _members(topo, r, origin, i, env, region)
        if r["type"] in (DEFAULT_NACL, DEFAULT_RT):
            _defaults(topo, r, origin, i)
    _places(topo, later)
    topo.sites = {s.name: s for s in sites}
    for group in topo.security_groups.values():
        group.rules = [replace(rule, group=group.id) if rule.group == "self" else rule for rule in group.rules]
    for cluster_group in sorted(topo.cluster_groups):
        topo.security_groups.setdefault(cluster_group, _eks_cluster_group(cluster_group))
    return topo


def _eks_cluster_group(group: str) -> SecurityGroup:
    # EKS creates the cluster security group with two rules: all traffic from itself, and all traffic out
    # (EKS user guide, "View Amazon EKS security group requirements for clusters").
    origin = Resource("", f"eks-cluster-security-group {group}", "")
    return SecurityGroup(
        id=group,
        origin=origin,
        vpc_id="",
        rules=[
            SgRule(origin, "ingress", "-1", None, None, group=group),
            SgRule(origin, "egress", "-1", None, None, cidr=ipaddress.IPv4Network("0.0.0.0/0")),
        ],
    )


def _route_target(i: Mapping[str, Any]) -> tuple[RouteTarget, str]:
    if i.get("transitGatewayId"):
        return "tgw", str(i["transitGatewayId"])
    if i.get("natGatewayId"):
        return "nat", str(i["natGatewayId"])
    gateway = str(i.get("gatewayId") or "")
    if gateway == "local":
        return "local", "local"
    if gateway.startswith("igw-"):
        return "igw", gateway
    for key in ("vpcPeeringConnectionId", "networkInterfaceId", "vpcEndpointId", "egressOnlyGatewayId", "gatewayId"):
        if i.get(key):
            return "other", str(i[key])
    return "blackhole", ""


def _az(inputs: Mapping[str, Any], region: str) -> str:
    """A subnet's AZ as the fleet names it: subnets are placed by zone id, which regions.yaml labels."""
    if inputs.get("availabilityZone"):
        return str(inputs["availabilityZone"])
    zone = str(inputs.get("availabilityZoneId") or "")
    info = known_regions().get(region)
    return (info.az_of(zone) if info else None) or zone


def _containers(
    topo: Topology, r: Mapping[str, Any], origin: Resource, i: Mapping[str, Any], env: str, region: str
) -> None:
    t, rid = r["type"], r["id"]
    if t == VPC:
        topo.vpcs[rid] = Vpc(rid, origin, region, env, [n for n in [_net(i.get("cidrBlock"))] if n])
        topo.vpcs[rid].default_route_table = str(r["outputs"].get("defaultRouteTableId") or "")
        topo.vpcs[rid].default_acl_id = str(r["outputs"].get("defaultNetworkAclId") or "")
    elif t == SUBNET:
        cidr = _net(i.get("cidrBlock"))
        if cidr:
            topo.subnets[rid] = Subnet(
                rid,
                origin,
                str(i.get("vpcId")),
                cidr,
                _az(i, region),
                bool(i.get("mapPublicIpOnLaunch")),
            )
    elif t == ROUTE_TABLE:
        table = RouteTable(rid, origin, str(i.get("vpcId")))
        for inline in i.get("routes") or []:
            dest = _net(inline.get("cidrBlock"))
            if dest:
                kind, target = _route_target(inline)
                table.routes.append(Route(dest, kind, target, origin))
        topo.route_tables[rid] = table
    elif t == IGW:
        topo.igws[rid] = str(i.get("vpcId"))
    elif t == NAT:
        topo.nats[rid] = Nat(rid, origin, str(i.get("subnetId")), i.get("connectivityType", "public") == "public")
    elif t == SG:
        group = SecurityGroup(rid, origin, str(i.get("vpcId")))
        for direction in ("ingress", "egress"):
            for inline in i.get(direction) or []:
                group.rules.extend(_inline_sg_rules(topo, origin, direction, inline))
        topo.security_groups[rid] = group
    elif t == NACL:
        topo.nacls[rid] = _acl(rid, origin, str(i.get("vpcId")), i)
    elif t == TGW:
        topo.tgws[rid] = TransitGateway(
            rid,
            origin,
            region,
            i.get("defaultRouteTableAssociation", "enable") == "enable",
            i.get("defaultRouteTablePropagation", "enable") == "enable",
        )
    elif t == TGW_RT:
        topo.tgw_route_tables[rid] = TgwRouteTable(rid, origin, str(i.get("transitGatewayId")))
    elif t == TGW_VPC:
        topo.attachments[rid] = Attachment(
            rid,
            origin,
            "vpc",
            str(i.get("transitGatewayId")),
            vpc_id=str(i.get("vpcId")),
            subnet_ids=_ids(i.get("subnetIds")),
        )
    elif t == TGW_PEERING:
        topo.attachments[rid] = Attachment(
            rid, origin, "peering", str(i.get("transitGatewayId")), peer_tgw_id=str(i.get("peerTransitGatewayId"))
        )
    elif t == VPN and i.get("transitGatewayId"):
        att = str(r["outputs"].get("transitGatewayAttachmentId") or "")
        if att:
            topo.attachments[att] = Attachment(
                att,
                origin,
                "vpn",
                str(i["transitGatewayId"]),
                site=_tags(r).get("dlinfra:site"),
                static_routes_only=bool(i.get("staticRoutesOnly")),
                connection_id=r["id"],
            )
    elif t == CVPN:
        client = _net(i.get("clientCidrBlock"))
        if client:
            auth = i.get("authenticationOptions") or []
            topo.client_vpns[rid] = ClientVpn(
                rid,
                origin,
                region,
                env,
                client,
                _ids(i.get("securityGroupIds")),
                any(a.get("type") == "federated-authentication" for a in auth),
            )
    elif t == EKS:
        created = ((r["outputs"].get("vpcConfig") or {}).get("clusterSecurityGroupId")) or ""
        if created:
            topo.cluster_groups.add(str(created))


def _acl(rid: str, origin: Resource, vpc_id: str, i: Mapping[str, Any]) -> NetworkAcl:
    """A network ACL with its inline rules (NetworkAcl and DefaultNetworkAcl share the shape)."""
    acl = NetworkAcl(rid, origin, vpc_id, set(_ids(i.get("subnetIds"))))
    for key, egress in (("ingress", False), ("egress", True)):
        for inline in i.get(key) or []:
            cidr = _net(inline.get("cidrBlock"))
            if cidr:
                acl.rules.append(
                    NaclRule(
                        int(float(inline["ruleNo"])),
                        egress,
                        inline.get("action") == "allow",
                        _protocol(inline.get("protocol")),
                        cidr,
                        _port(inline.get("fromPort")),
                        _port(inline.get("toPort")),
                        origin,
                    )
                )
    return acl


def _defaults(topo: Topology, r: Mapping[str, Any], origin: Resource, i: Mapping[str, Any]) -> None:
    """A DefaultNetworkAcl or DefaultRouteTable: the VPC's own ACL and main route table, taken over."""
    if r["type"] == DEFAULT_RT:
        vpc = next((v for v in topo.vpcs.values() if v.default_route_table == i.get("defaultRouteTableId")), None)
        if vpc is None:
            return
        table = RouteTable(str(i.get("defaultRouteTableId")), origin, vpc.id)
        for inline in i.get("routes") or []:
            dest = _net(inline.get("cidrBlock"))
            if dest:
                kind, target = _route_target(inline)
                table.routes.append(Route(dest, kind, target, origin))
        topo.route_tables[table.id] = table
        vpc.main_route_table = vpc.main_route_table or table.id
    elif r["type"] == DEFAULT_NACL:
        # Its VPC: the one whose default ACL id it names, else the one VPC its stack declares (dlinfra declares one
        # per regional stack, and its fake cloud gives VPCs no default ACL id); otherwise refused, not guessed.
        named = [v for v in topo.vpcs.values() if v.default_acl_id and v.default_acl_id == i.get("defaultNetworkAclId")]
        vpcs = named or [v for v in topo.vpcs.values() if v.origin.stack == origin.stack]
        if len(vpcs) != 1:
            topo.unresolved.append((origin, f"default network ACL {i.get('defaultNetworkAclId')} of no single VPC"))
            return
        acl = _acl(str(r["id"]), origin, vpcs[0].id, i)
        topo.nacls[acl.id] = acl
        vpcs[0].default_acl = acl.id


def _inline_sg_rules(topo: Topology, origin: Resource, direction: str, inline: Mapping[str, Any]) -> Iterator[SgRule]:
    proto = _protocol(inline.get("protocol"))
    lo, hi = _port(inline.get("fromPort")), _port(inline.get("toPort"))
    cidrs = list(inline.get("cidrBlocks") or [])
    for listed in _ids(inline.get("prefixListIds")):
        if listed in topo.prefix_lists:
            cidrs += [str(n) for n in topo.prefix_lists[listed]]
        else:
            topo.unresolved.append((origin, f"prefix list {listed}"))
    for cidr in cidrs:
        net = _net(cidr)
        if net:
            yield SgRule(origin, direction, proto, lo, hi, cidr=net)  # type: ignore[arg-type]
    for group in inline.get("securityGroups") or []:
        yield SgRule(origin, direction, proto, lo, hi, group=str(group))  # type: ignore[arg-type]
    if inline.get("self"):
        yield SgRule(origin, direction, proto, lo, hi, group="self")  # type: ignore[arg-type]


def _members(
    topo: Topology, r: Mapping[str, Any], origin: Resource, i: Mapping[str, Any], env: str, region: str
) -> None:
    t = r["type"]
    if t == VPC_CIDR and i.get("vpcId") in topo.vpcs:
        net = _net(i.get("cidrBlock"))
        if net:
            topo.vpcs[i["vpcId"]].cidrs.append(net)
    elif t == ROUTE and i.get("routeTableId") in topo.route_tables:
        dest = _net(i.get("destinationCidrBlock"))
        if dest:
            kind, target = _route_target(i)
            topo.route_tables[i["routeTableId"]].routes.append(Route(dest, kind, target, origin))
    elif t == RT_ASSOC and i.get("subnetId"):
        topo.subnet_route_table[str(i["subnetId"])] = str(i.get("routeTableId"))
    elif t == MAIN_RT_ASSOC and i.get("vpcId") in topo.vpcs:
        topo.vpcs[i["vpcId"]].main_route_table = str(i.get("routeTableId"))
    elif t in (SG_INGRESS, SG_EGRESS) and i.get("securityGroupId") in topo.security_groups:
        cidr, group = _net(i.get("cidrIpv4")), i.get("referencedSecurityGroupId") or None
        listed = str(i.get("prefixListId") or "")
        peers: list[tuple[Net | None, str | None]] = [(cidr, group)] if cidr or group else []
        if listed and listed in topo.prefix_lists:
            peers += [(n, None) for n in topo.prefix_lists[listed]]
        elif listed:
            topo.unresolved.append((origin, f"prefix list {listed}"))
        for peer_cidr, peer_group in peers:
            topo.security_groups[i["securityGroupId"]].rules.append(
                SgRule(
                    origin,
                    "ingress" if t == SG_INGRESS else "egress",
                    _protocol(i.get("ipProtocol")),
                    _port(i.get("fromPort")),
                    _port(i.get("toPort")),
                    cidr=peer_cidr,
                    group=peer_group,
                )
            )
    elif t == SG_RULE and i.get("securityGroupId") in topo.security_groups:
        group = topo.security_groups[i["securityGroupId"]]
        inline = {
            **i,
            "self": i.get("self"),
            "securityGroups": [i["sourceSecurityGroupId"]] if i.get("sourceSecurityGroupId") else [],
        }
        group.rules.extend(_inline_sg_rules(topo, origin, str(i.get("type")), inline))
    elif t == NACL_RULE and i.get("networkAclId") in topo.nacls:
        cidr = _net(i.get("cidrBlock"))
        if cidr:
            topo.nacls[i["networkAclId"]].rules.append(
                NaclRule(
                    int(float(i["ruleNumber"])),
                    bool(i.get("egress")),
                    i.get("ruleAction") == "allow",
                    _protocol(i.get("protocol")),
                    cidr,
                    _port(i.get("fromPort")),
                    _port(i.get("toPort")),
                    origin,
                )
            )
    elif t == NACL_ASSOC and i.get("networkAclId") in topo.nacls:
        topo.nacls[i["networkAclId"]].subnet_ids.add(str(i.get("subnetId")))
    elif t == TGW_ASSOC and i.get("transitGatewayRouteTableId") in topo.tgw_route_tables:
        topo.tgw_route_tables[i["transitGatewayRouteTableId"]].associations.add(str(i["transitGatewayAttachmentId"]))
    elif t == TGW_PROP and i.get("transitGatewayRouteTableId") in topo.tgw_route_tables:
        topo.tgw_route_tables[i["transitGatewayRouteTableId"]].propagations.add(str(i["transitGatewayAttachmentId"]))
    elif t == TGW_ROUTE and i.get("transitGatewayRouteTableId") in topo.tgw_route_tables:
        dest = _net(i.get("destinationCidrBlock"))
        if dest:
            to = None if i.get("blackhole") else (str(i.get("transitGatewayAttachmentId") or "") or None)
            topo.tgw_route_tables[i["transitGatewayRouteTableId"]].routes.append(TgwRoute(dest, to, origin))
    elif t == "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter":
        att = topo.attachments.get(str(i.get("transitGatewayAttachmentId")))
        if att:
            att.accepted = True
    elif t == VPN_ROUTE:
        net = _net(i.get("destinationCidrBlock"))
        if net:
            topo.vpn_routes.setdefault(str(i.get("vpnConnectionId")), []).append(net)
    elif t == CVPN_ASSOC and i.get("clientVpnEndpointId") in topo.client_vpns:
        topo.client_vpns[i["clientVpnEndpointId"]].subnets.add(str(i.get("subnetId")))
    elif t == CVPN_ROUTE and i.get("clientVpnEndpointId") in topo.client_vpns:
        dest = _net(i.get("destinationCidrBlock"))
        if dest:
            topo.client_vpns[i["clientVpnEndpointId"]].routes.append((dest, str(i.get("targetVpcSubnetId")), origin))
    elif t == CVPN_AUTH and i.get("clientVpnEndpointId") in topo.client_vpns:
        dest = _net(i.get("targetNetworkCidr"))
        if dest:
            group = None if i.get("authorizeAllGroups") else str(i.get("accessGroupId") or "") or None
            if group is None and not i.get("authorizeAllGroups"):
                return  # neither a group nor all groups: AWS refuses it; it authorizes nobody
            topo.client_vpns[i["clientVpnEndpointId"]].auth_rules.append(AuthRule(dest, group, origin))


def _places(topo: Topology, resources: list[tuple[Mapping[str, Any], Resource, Mapping[str, Any], str, str]]) -> None:
    templates: dict[str, tuple[str, ...]] = {}
    public: dict[str, bool | None] = {}  # launch template -> its interface's public address setting
    for r, _origin, i, _env, _region in resources:
        if r["type"] == LAUNCH_TEMPLATE:
            template_groups = list(_ids(i.get("vpcSecurityGroupIds")))
            for nic in i.get("networkInterfaces") or []:
                template_groups.extend(g for g in _ids(nic.get("securityGroups")) if g not in template_groups)
            templates[r["id"]] = tuple(template_groups)
            # The device-0 interface's associatePublicIpAddress overrides the subnet's public IP on launch
            # (EC2 API, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest).
            # AWS assigns one only to a single interface at device index 0.
            nics = i.get("networkInterfaces") or []
            first = [n for n in nics if int(float(n.get("deviceIndex") or 0)) == 0]
            public[r["id"]] = _flag(first[0].get("associatePublicIpAddress")) if len(nics) == 1 and first else None

    def vpc_of(subnets: tuple[str, ...]) -> str:
        return next((topo.subnets[s].vpc_id for s in subnets if s in topo.subnets), "")

    for r, origin, i, env, region in resources:
        t = r["type"]
        if t == ASG:
            spec = (
                i.get("launchTemplate")
                or ((i.get("mixedInstancesPolicy") or {}).get("launchTemplate") or {}).get(
                    "launchTemplateSpecification"
                )
                or {}
            )
            template = str(spec.get("id") or spec.get("launchTemplateId") or "")
            groups = templates.get(template, ())
            subnets = _ids(i.get("vpcZoneIdentifiers"))
            pool = next((str(tag.get("value")) for tag in i.get("tags") or [] if tag.get("key") == "dlinfra:pool"), "")
            pool = pool or r["name"].removeprefix("pool-").removesuffix("-asg")
            topo.places.append(
                Place("pool", pool, env, region, vpc_of(subnets), subnets, groups, origin, public.get(template))
            )
        elif t == INSTANCE:
            subnets = _ids(i.get("subnetId"))
            groups = _ids(i.get("vpcSecurityGroupIds")) or templates.get(
                str((i.get("launchTemplate") or {}).get("id") or ""), ()
            )
            has_eip = r["id"] in topo.public_ips or _flag(i.get("associatePublicIpAddress"))
            person = (i.get("tags") or {}).get(DEV_BOX_TAG)  # a dev box: named by its person (components/dev_box.py)
            kind, name = ("dev-box", str(person)) if person else ("instance", r["name"])
            private_ip = (r.get("outputs") or {}).get("privateIp")  # known in offline plans; a /32 then
            own = _net(f"{private_ip}/32") if private_ip else None
            topo.places.append(
                Place(kind, name, env, region, vpc_of(subnets), subnets, groups, origin, has_eip, address=own)
            )
        elif t == EKS:
            vpc_config = i.get("vpcConfig") or {}
            subnets = _ids(vpc_config.get("subnetIds"))
            cluster_group = (r["outputs"].get("vpcConfig") or {}).get("clusterSecurityGroupId")
            plane_groups = (*_ids(cluster_group), *_ids(vpc_config.get("securityGroupIds")))
            remote = i.get("remoteNetworkConfig") or {}
            remote_nets = tuple(
                n
                for key in ("remoteNodeNetworks", "remotePodNetworks")
                for entry in _as_list(remote.get(key))
                for n in (_net(c) for c in entry.get("cidrs") or [])
                if n
            )
            # A public endpoint (the provider's default) admits HTTPS from publicAccessCidrs, 0.0.0.0/0 unless given
            # (EKS API, VpcConfigRequest).
            public_api = None
            if _flag(vpc_config.get("endpointPublicAccess")) is not False:
                cidrs = [n for n in (_net(c) for c in vpc_config.get("publicAccessCidrs") or ["0.0.0.0/0"]) if n]
                public_api = tuple(cidrs)
            topo.places.append(
                Place(
                    "control-plane",
                    str(i.get("name")),
                    env,
                    region,
                    vpc_of(subnets),
                    subnets,
                    plane_groups,
                    origin,
                    remote_networks=remote_nets,
                    public_api=public_api,
                )
            )
        elif t == EFS_MOUNT:
            subnets = _ids(i.get("subnetId"))
            topo.places.append(
                Place("efs", r["name"], env, region, vpc_of(subnets), subnets, _ids(i.get("securityGroups")), origin)
            )
        elif t == FSX_LUSTRE:
            subnets = _ids(i.get("subnetIds"))
            topo.places.append(
                Place("fsx", r["name"], env, region, vpc_of(subnets), subnets, _ids(i.get("securityGroupIds")), origin)
            )
        elif t == ENDPOINT and i.get("vpcEndpointType") == "Interface":
            subnets = _ids(i.get("subnetIds"))
            service = str(i.get("serviceName", "")).split(".")[-1]
            if str(i.get("serviceName", "")).endswith(("ecr.api", "ecr.dkr")):
                service = ".".join(str(i["serviceName"]).split(".")[-2:])
            topo.places.append(
                Place(
                    "endpoint", service, env, region, vpc_of(subnets), subnets, _ids(i.get("securityGroupIds")), origin
                )
            )
        elif t == CODEBUILD and i.get("vpcConfig"):
            vc = i["vpcConfig"]
            subnets = _ids(vc.get("subnets"))
            topo.places.append(
                Place(
                    "ci-runner",
                    str(i.get("name")),
                    env,
                    region,
                    vpc_of(subnets),
                    subnets,
                    _ids(vc.get("securityGroupIds")),
                    origin,
                )
            )
