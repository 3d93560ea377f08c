"""Who can reach and do what: EKS access, RBAC, laptop VPN, sites, pod identities, and which EFS paths and S3
prefixes each team may read or write (dlinfra.review.data_access), read from plan exports.

Pure code over the offline plans (docs/plan-export.md): no pulumi import. The fleet only names principals
(which team owns a role or a VPN group, which sites a hybrid node role serves, who holds a VPN certificate).
Networks come from a `Reach` function: today's one reads Client VPN authorization rules and transit gateway
routes; a hop-by-hop model can replace it without touching the rest (`build_report(..., reach=...)`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from dlinfra.checks.plans import Plan, load_plan
from dlinfra.errors import DlinfraError
from dlinfra.model.dev_boxes import DEV_BOX_TAG
from dlinfra.model.fleet.schema import Fleet
from dlinfra.review.data_access import DataGrant, team_data

# v2 added `data` to every principal (and the team-data kind); from_json still reads v1, whose principals have none.
SCHEMA = "dlinfra.access/v2"
_READS = (SCHEMA, "dlinfra.access/v1")

Kind = Literal["admin", "ci-apply", "ci-preview", "team-role", "team-data", "vpn-group", "vpn-users", "site",
               "node-role", "pod-identity", "service-account", "role"]  # fmt: skip
KINDS: tuple[str, ...] = get_args(Kind)

ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
ADDON = "aws:eks/addon:Addon"
CLUSTER = "aws:eks/cluster:Cluster"
AUTH_RULE = "aws:ec2clientvpn/authorizationRule:AuthorizationRule"
CVPN_ENDPOINT = "aws:ec2clientvpn/endpoint:Endpoint"
CVPN_ROUTE = "aws:ec2clientvpn/route:Route"
VPC = "aws:ec2/vpc:Vpc"
VPN_CONNECTION = "aws:ec2/vpnConnection:VpnConnection"
VPC_ATTACHMENT = "aws:ec2transitgateway/vpcAttachment:VpcAttachment"
TGW_ROUTE = "aws:ec2transitgateway/route:Route"
TGW_ASSOCIATION = "aws:ec2transitgateway/routeTableAssociation:RouteTableAssociation"
TGW_PROPAGATION = "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

# EKS access policies by what they let a principal do (AWS: "Review access policy permissions").
_EKS_POLICIES = {
    "AmazonEKSClusterAdminPolicy": "cluster-admin",
    "AmazonEKSAdminPolicy": "admin",
    "AmazonEKSEditPolicy": "edit",
    "AmazonEKSViewPolicy": "view",
    "AmazonEKSAdminViewPolicy": "view (secrets too)",
}
# Node entry types: EKS binds them to system:nodes, i.e. the kubelet's rights, nothing more.
_NODE_ENTRY_TYPES = {"EC2_LINUX", "EC2_WINDOWS", "HYBRID_LINUX"}


class AccessError(DlinfraError):
    """Plans missing for the access report, or a filter naming nothing in the fleet."""


@dataclass(frozen=True)
class ClusterGrant:
    """One thing a principal may do in one cluster, and what in the plan says so."""

    cluster: str  # EKS cluster name
    region: str
    access: str  # cluster-admin | admin | edit | view | node | <ClusterRole or Role name>
    scope: str  # "cluster", or the namespaces, comma-separated
    source: str  # the access policy, node entry type or RBAC binding that grants it


@dataclass(frozen=True)
class NetworkAccess:
    """A named network a principal can reach, and through what."""

    network: str  # vpc-<region> | lan-<site> | pods-<site> | the CIDR when nothing names it
    cidr: str
    via: str  # "client-vpn <region>" or "transit-gateway <region>"
    routed: bool = True  # for Client VPN: the endpoint also has a route there (authorized but unrouted is dead)


@dataclass(frozen=True)
class Principal:
    """Someone or something that holds access in one environment."""

    environment: str
    kind: str  # one of KINDS
    name: str  # team, site, role, VPN group, or namespace/service-account
    team: str | None = None  # owning team, when the fleet says
    arn: str | None = None  # IAM role ARN, when the principal is one
    group: str | None = None  # VPN (SAML) group id, or "*" for every authenticated user
    region: str | None = None  # for per-region principals (sites, pod identities, node roles)
    members: tuple[str, ...] = ()  # certificate users, or sites served by a hybrid node role
    clusters: tuple[ClusterGrant, ...] = ()
    networks: tuple[NetworkAccess, ...] = ()
    actions: tuple[str, ...] = ()  # IAM actions the role's inline policies allow
    managed_policies: tuple[str, ...] = ()  # AWS managed policies attached to the role
    also: tuple[str, ...] = ()  # other resources in the plans that name this role ("<type> <name>")
    data: tuple[DataGrant, ...] = ()  # team-data: the EFS paths and S3 prefixes the team's pods may use


Reach = Callable[[Principal], Sequence[NetworkAccess]]
"""The seam for the network part: a principal -> the named networks it can reach."""


@dataclass(frozen=True)
class Report:
    """Every principal of the selected environments, sorted by environment, kind and name."""

    principals: tuple[Principal, ...]
    stacks: tuple[str, ...]  # plans read

    def to_json(self) -> dict[str, Any]:
        """The documented JSON form (docs/access.md)."""
        return {
            "schema": SCHEMA,
            "stacks": list(self.stacks),
            "principals": [_plain(asdict(p)) for p in self.principals],
        }


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def from_json(data: Mapping[str, Any]) -> Report:
    """A report back from its JSON form (the inverse of Report.to_json)."""
    if data.get("schema") not in _READS:
        raise AccessError(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    principals = []
    for p in data["principals"]:
        fields = dict(p)
        fields["clusters"] = tuple(ClusterGrant(**g) for g in p["clusters"])
        fields["networks"] = tuple(NetworkAccess(**n) for n in p["networks"])
        fields["data"] = tuple(DataGrant(**g) for g in p.get("data", ()))
        for key in ("members", "actions", "managed_policies", "also"):
            fields[key] = tuple(p[key])
        principals.append(Principal(**fields))
    return Report(principals=tuple(principals), stacks=tuple(data["stacks"]))


# --- reading plans --------------------------------------------------------------------------------------
def load_plans(directory: Path, stacks: Sequence[str]) -> list[Plan]:
    """The plans of these stacks; one error naming what is missing and the command that writes it."""
    if not directory.is_dir():
        raise AccessError("no plan folder; run `dlinfra preview --all` to write the plans", file=str(directory))
    missing = [f"{s}.json" for s in stacks if not (directory / f"{s}.json").is_file()]
    if missing:
        raise AccessError(
            f"no plan export {', '.join(missing)}; run `dlinfra preview --all` to write every plan",
            file=str(directory),
        )
    return [load_plan(directory / f"{s}.json") for s in stacks]


@dataclass
class _Env:
    """One environment's plans, indexed by resource type."""

    name: str
    plans: list[Plan] = field(default_factory=list)

    def of(self, type_: str, kind: str | None = None) -> Iterable[tuple[Plan, Mapping[str, Any]]]:
        for plan in self.plans:
            if kind is None or plan.data["role"].get("kind") == kind:
                for r in plan.resources:
                    if r["type"] == type_:
                        yield plan, r


def _region(plan: Plan) -> str:
    return str(plan.data["role"].get("region") or "")


def role_name(arn: str) -> str:
    """The last part of an IAM role ARN."""
    return arn.rsplit("/", 1)[-1]


# --- network names --------------------------------------------------------------------------------------
_DESCRIBED = re.compile(r" to (?P<name>[a-z0-9-]+)$")
_THROUGH = re.compile(r"^(?P<name>[a-z0-9-]+) through ")
_SITE_ROUTE = re.compile(r"^site-(?P<site>[a-z0-9-]+)-route-(?P<what>lan|pods)$")


def network_names(env: _Env) -> dict[str, str]:
    """CIDR -> network name, from the names the plans already give (VPCs, rule and route descriptions)."""
    names: dict[str, str] = {}
    for plan, r in env.of(VPC):
        names[r["inputs"]["cidrBlock"]] = f"vpc-{_region(plan)}"
    for _, r in env.of(TGW_ROUTE):
        m = _SITE_ROUTE.match(r["name"])
        if m:
            names.setdefault(r["inputs"]["destinationCidrBlock"], f"{m['what']}-{m['site']}")
    for type_, pattern in ((AUTH_RULE, _DESCRIBED), (CVPN_ROUTE, _THROUGH)):
        for plan, r in env.of(type_):
            m = pattern.search(r["inputs"].get("description") or "")
            cidr = r["inputs"].get("targetNetworkCidr") or r["inputs"].get("destinationCidrBlock")
            if m and cidr:
                name = f"vpc-{_region(plan)}" if m["name"] == "vpc" else m["name"]
                names.setdefault(cidr, name)
    return names


# --- the default Reach: Client VPN authorization rules and transit routes -------------------------------
def rules_reach(envs: Mapping[str, _Env]) -> Reach:
    """Networks from what Client VPN authorization rules allow and transit gateway route tables route."""
    names = {e: network_names(env) for e, env in envs.items()}

    def reach(principal: Principal) -> Sequence[NetworkAccess]:
        env = envs.get(principal.environment)
        if env is None:
            return ()
        if principal.kind in ("vpn-group", "vpn-users") and principal.group:
            return _vpn_networks(env, names[env.name], principal.group)
        if principal.kind == "site":
            return _site_networks(env, names[env.name], principal.name)
        return ()

    return reach


def _vpn_networks(env: _Env, names: Mapping[str, str], group: str) -> list[NetworkAccess]:
    routes: dict[str, set[str]] = {}
    for _, r in env.of(CVPN_ROUTE):
        routes.setdefault(r["inputs"]["clientVpnEndpointId"], set()).add(r["inputs"]["destinationCidrBlock"])
    # A dev box's own rule names its /32 (components/dev_box.py): named by its person, routed with its VPC.
    boxes = {
        f"{r['outputs'].get('privateIp')}/32": f"devbox-{(r['inputs'].get('tags') or {})[DEV_BOX_TAG]}"
        for _, r in env.of("aws:ec2/instance:Instance")
        if DEV_BOX_TAG in (r["inputs"].get("tags") or {})
    }
    found = []
    for plan, r in env.of(AUTH_RULE):
        i = r["inputs"]
        if not ((group == "*" and i.get("authorizeAllGroups")) or i.get("accessGroupId") == group):
            continue
        cidr = i["targetNetworkCidr"]
        vpc = next((c for c, n in names.items() if n == f"vpc-{_region(plan)}"), None)
        # The subnet association routes the VPC itself, and so every address in it.
        local = vpc is not None and ipaddress.IPv4Network(cidr).subnet_of(ipaddress.IPv4Network(vpc))
        routed = local or cidr in routes.get(i["clientVpnEndpointId"], set())
        found.append(
            NetworkAccess(names.get(cidr) or boxes.get(cidr, cidr), cidr, f"client-vpn {_region(plan)}", routed)
        )
    return sorted(found, key=lambda n: (n.via, n.network))


def _site_networks(env: _Env, names: Mapping[str, str], site: str) -> list[NetworkAccess]:
    """What the route table the site's VPN attachment is associated with routes to (other than the site)."""
    own = {f"lan-{site}", f"pods-{site}"}
    vpn = next((r for _, r in env.of(VPN_CONNECTION) if r["name"] == f"site-{site}-vpn"), None)
    if vpn is None:
        return []
    attachment = vpn["outputs"].get("transitGatewayAttachmentId")
    tables = {
        (a["inputs"]["transitGatewayRouteTableId"], _region(p))
        for p, a in env.of(TGW_ASSOCIATION)
        if a["inputs"]["transitGatewayAttachmentId"] == attachment
    }
    vpc_cidrs = {r["id"]: r["inputs"]["cidrBlock"] for _, r in env.of(VPC)}
    attachment_cidrs = {
        a["id"]: [vpc_cidrs[a["inputs"]["vpcId"]]]
        for _, a in env.of(VPC_ATTACHMENT)
        if a["inputs"]["vpcId"] in vpc_cidrs
    }
    for _, v in env.of(VPN_CONNECTION):  # a propagated site attachment brings that site's networks
        m = re.match(r"^site-(.+)-vpn$", v["name"])
        if m and v["outputs"].get("transitGatewayAttachmentId") and m[1] != site:
            cidrs = [c for c, n in names.items() if n in (f"lan-{m[1]}", f"pods-{m[1]}")]
            attachment_cidrs[v["outputs"]["transitGatewayAttachmentId"]] = cidrs
    found: dict[str, NetworkAccess] = {}
    for table, region in tables:
        via = f"transit-gateway {region}"
        for _, r in env.of(TGW_ROUTE):
            if r["inputs"].get("transitGatewayRouteTableId") == table and not r["inputs"].get("blackhole"):
                cidr = r["inputs"]["destinationCidrBlock"]
                found.setdefault(cidr, NetworkAccess(names.get(cidr, cidr), cidr, via))
        for _, r in env.of(TGW_PROPAGATION):
            if r["inputs"]["transitGatewayRouteTableId"] == table:
                for cidr in attachment_cidrs.get(r["inputs"]["transitGatewayAttachmentId"], []):
                    found.setdefault(cidr, NetworkAccess(names.get(cidr, cidr), cidr, f"{via} (propagated)"))
    return sorted((n for n in found.values() if n.network not in own), key=lambda n: n.network)


# --- principals -----------------------------------------------------------------------------------------
@dataclass
class _Draft:
    """A principal being assembled; frozen into a Principal at the end."""

    environment: str
    kind: str
    name: str
    team: str | None = None
    arn: str | None = None
    group: str | None = None
    region: str | None = None
    members: set[str] = field(default_factory=set)
    clusters: set[ClusterGrant] = field(default_factory=set)
    actions: set[str] = field(default_factory=set)
    managed_policies: set[str] = field(default_factory=set)
    also: set[str] = field(default_factory=set)
    data: tuple[DataGrant, ...] = ()


def _classify(fleet: Fleet | None, env: str, arn: str, entry_type: str, region: str) -> tuple[str, str, str | None]:
    """(kind, name, team) of an access entry's principal, named by the fleet where it knows the role."""
    spec = fleet.environments.get(env) if fleet else None
    if spec is not None and spec.ci is not None:
        if arn == spec.ci.apply_role_arn:
            return "ci-apply", role_name(arn), None
        if arn == spec.ci.preview_role_arn:
            return "ci-preview", role_name(arn), None
    if spec is not None and arn in spec.kubernetes.admin_role_arns:
        return "admin", role_name(arn), None
    for team_name, team in fleet.teams.items() if fleet else ():
        if team.role_arn == arn:
            return "team-role", team_name, team_name
    if entry_type == "HYBRID_LINUX":
        return "site", f"hybrid-nodes-{region}", None
    if entry_type in _NODE_ENTRY_TYPES:
        return "node-role", role_name(arn), None
    return "role", role_name(arn), None


def _policy_actions(policy: str) -> set[str]:
    try:
        doc = json.loads(policy)
    except (TypeError, json.JSONDecodeError):
        return {"(unreadable policy)"}
    statements = doc.get("Statement", [])
    actions: set[str] = set()
    for s in statements if isinstance(statements, list) else [statements]:
        if s.get("Effect") == "Allow":
            listed = s.get("Action", [])
            actions.update([listed] if isinstance(listed, str) else listed)
    return actions


def build_report(
    plans: Sequence[Plan], fleet: Fleet | None = None, *, reach: Reach | None = None, team: str | None = None
) -> Report:
    """Every principal with access in the environments these plans cover; `reach` supplies the networks."""
    envs: dict[str, _Env] = {}
    for plan in plans:
        env_name = str(plan.data["role"].get("environment") or plan.stack.split("-", 1)[0])
        envs.setdefault(env_name, _Env(env_name)).plans.append(plan)
    reach = reach or rules_reach(envs)
    drafts: dict[tuple[str, str, str], _Draft] = {}

    def draft(env: str, kind: str, name: str, **known: Any) -> _Draft:
        d = drafts.setdefault((env, kind, name), _Draft(env, kind, name))
        for key, value in known.items():
            if value is not None:
                setattr(d, key, value)
        return d

    for env in envs.values():
        _eks_principals(env, fleet, draft)
        _vpn_principals(env, fleet, draft)
        _site_principals(env, fleet, draft)
        _pod_identities(env, draft)
        _service_accounts(env, draft)
        _also_named(env, drafts.values())
    for (env_name, team_name), grants in team_data(plans).items():
        draft(env_name, "team-data", team_name, team=team_name).data = grants
    principals = []
    for d in drafts.values():
        p = Principal(
            environment=d.environment, kind=d.kind, name=d.name, team=d.team, arn=d.arn, group=d.group,
            region=d.region, members=tuple(sorted(d.members)),
            clusters=tuple(sorted(d.clusters, key=lambda g: (g.region, g.cluster, g.access, g.scope))),
            actions=tuple(sorted(d.actions)), managed_policies=tuple(sorted(d.managed_policies)),
            also=tuple(sorted(d.also)), data=d.data,
        )  # fmt: skip
        networks = tuple(reach(p))
        principals.append(dataclasses.replace(p, networks=networks))
    if team is not None:
        principals = [p for p in principals if p.team == team]
    principals.sort(key=lambda p: (p.environment, KINDS.index(p.kind), p.name))
    return Report(principals=tuple(principals), stacks=tuple(sorted(p.stack for p in plans)))


Drafter = Callable[..., _Draft]


def _eks_principals(env: _Env, fleet: Fleet | None, draft: Drafter) -> None:
    clusters = {r["inputs"]["name"]: _region(p) for p, r in env.of(CLUSTER)}
    policies: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for _, r in env.of(ACCESS_POLICY):
        policies.setdefault((r["inputs"]["clusterName"], r["inputs"]["principalArn"]), []).append(r["inputs"])
    # Kubernetes group -> (access, scope, source) from the in-cluster stack of the same region.
    bindings: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for type_ in (ROLE_BINDING, CLUSTER_ROLE_BINDING):
        for plan, r in env.of(type_, kind="k8s"):
            i = r["inputs"]
            meta, ref = i.get("metadata", {}), i.get("roleRef", {})
            scope = meta.get("namespace") or "cluster"
            source = _binding_source(i, type_)
            for subject in i.get("subjects") or ():
                if subject.get("kind") == "Group":
                    bindings.setdefault((_region(plan), subject["name"]), []).append((ref.get("name"), scope, source))
    for plan, r in env.of(ACCESS_ENTRY):
        i = r["inputs"]
        cluster, arn, entry_type = i["clusterName"], i["principalArn"], i.get("type", "STANDARD")
        region = clusters.get(cluster, _region(plan))
        kind, name, team = _classify(fleet, env.name, arn, entry_type, region)
        if kind == "site":
            sites = sorted(fleet.sites_of(env.name, region)) if fleet else []
            targets = [draft(env.name, "site", s, region=region) for s in sites] or [draft(env.name, kind, name)]
        else:
            targets = [draft(env.name, kind, name, team=team, region=region if kind == "node-role" else None)]
        grants: set[ClusterGrant] = set()
        if entry_type in _NODE_ENTRY_TYPES:
            grants.add(ClusterGrant(cluster, region, "node", "cluster", f"access entry {entry_type}"))
        for assoc in policies.get((cluster, arn), []):
            policy = assoc["policyArn"].rsplit("/", 1)[-1]
            scope = assoc.get("accessScope") or {}
            where = "cluster" if scope.get("type") == "cluster" else ",".join(scope.get("namespaces") or ())
            grants.add(
                ClusterGrant(cluster, region, _EKS_POLICIES.get(policy, policy), where, f"access policy {policy}")
            )
        for group in i.get("kubernetesGroups") or ():
            for access, where, source in bindings.get((region, group), []):
                grants.add(ClusterGrant(cluster, region, access, where, f"group {group}: {source}"))
        for d in targets:
            d.arn = arn
            d.clusters |= grants


def _vpn_principals(env: _Env, fleet: Fleet | None, draft: Drafter) -> None:
    spec = fleet.environments.get(env.name) if fleet else None
    cvpn = spec.client_vpn if spec else None
    saml = cvpn.saml if cvpn else None
    for _, r in env.of(AUTH_RULE):
        i = r["inputs"]
        if i.get("authorizeAllGroups"):
            endpoint = next((e for _, e in env.of(CVPN_ENDPOINT) if e["id"] == i["clientVpnEndpointId"]), None)
            auth = {o.get("type") for o in (endpoint or {}).get("inputs", {}).get("authenticationOptions", [])}
            users = "certificate-users" if "certificate-authentication" in auth else "every-signed-in-user"
            d = draft(env.name, "vpn-users", users, group="*")
            d.members |= set(cvpn.users if cvpn else ())
            continue
        group = i.get("accessGroupId")
        if not group:
            continue
        team = next((t for t, spec_ in (fleet.teams.items() if fleet else ()) if spec_.vpn_group == group), None)
        name = team or ("admins" if saml is not None and saml.admin_group == group else group)
        draft(env.name, "vpn-group", name, group=group, team=team)


def _site_principals(env: _Env, fleet: Fleet | None, draft: Drafter) -> None:
    for plan, r in env.of(VPN_CONNECTION):
        m = re.match(r"^site-(.+)-vpn$", r["name"])
        if m and (fleet is None or m[1] in fleet.sites):
            draft(env.name, "site", m[1], region=_region(plan))


def _binding_source(inputs: Mapping[str, Any], type_: str) -> str:
    """How a (Cluster)RoleBinding reads in the report: "RoleBinding team-edit -> ClusterRole edit"."""
    meta, ref = inputs.get("metadata", {}), inputs.get("roleRef", {})
    kind = inputs.get("kind", type_.rsplit(":", 1)[-1])
    return f"{kind} {meta.get('name')} -> {ref.get('kind')} {ref.get('name')}"


def _service_accounts(env: _Env, draft: Drafter) -> None:
    """Service accounts that dlinfra binds to roles: whoever holds their token (the MultiKueue manager holds its
    workers') acts with those roles."""
    clusters = {_region(p): r["inputs"]["name"] for p, r in env.of(CLUSTER)}
    for type_ in (ROLE_BINDING, CLUSTER_ROLE_BINDING):
        for plan, r in env.of(type_, kind="k8s"):
            i = r["inputs"]
            meta, ref = i.get("metadata", {}), i.get("roleRef", {})
            region = _region(plan)
            for subject in i.get("subjects") or ():
                if subject.get("kind") != "ServiceAccount":
                    continue
                d = draft(
                    env.name, "service-account", f"{subject.get('namespace')}/{subject['name']}@{region}", region=region
                )
                source = _binding_source(i, type_)
                d.clusters.add(
                    ClusterGrant(
                        clusters.get(region, ""),
                        region,
                        str(ref.get("name")),
                        meta.get("namespace") or "cluster",
                        source,
                    )
                )


def _pod_identities(env: _Env, draft: Drafter) -> None:
    inline: dict[str, set[str]] = {}
    for _, r in env.of(ROLE_POLICY):
        inline.setdefault(r["inputs"]["role"], set()).update(_policy_actions(r["inputs"].get("policy", "")))
    managed: dict[str, set[str]] = {}
    for _, r in env.of(POLICY_ATTACHMENT):
        managed.setdefault(r["inputs"]["role"], set()).add(r["inputs"]["policyArn"].rsplit("/", 1)[-1])
    found: list[tuple[Plan, str, str, str]] = []  # plan, namespace, service account, role ARN
    for plan, r in env.of(POD_IDENTITY):
        i = r["inputs"]
        found.append((plan, i["namespace"], i["serviceAccount"], i["roleArn"]))
    trust_ns = {}
    for _, r in env.of("aws:iam/role:Role"):
        try:
            for s in json.loads(r["inputs"].get("assumeRolePolicy", "{}")).get("Statement", []):
                ns = s.get("Condition", {}).get("StringEquals", {}).get("aws:RequestTag/kubernetes-namespace")
                if ns:
                    trust_ns[r["inputs"].get("name")] = ns
        except (TypeError, json.JSONDecodeError, AttributeError):
            continue
    for plan, r in env.of(ADDON):
        for assoc in r["inputs"].get("podIdentityAssociations") or ():
            role = role_name(assoc["roleArn"])
            found.append((plan, trust_ns.get(role, "kube-system"), assoc["serviceAccount"], assoc["roleArn"]))
    for plan, namespace, account, arn in found:
        role = role_name(arn)
        d = draft(env.name, "pod-identity", f"{namespace}/{account}@{_region(plan)}", arn=arn, region=_region(plan))
        d.actions |= inline.get(role, set())
        d.managed_policies |= managed.get(role, set())


def _also_named(env: _Env, drafts: Iterable[_Draft]) -> None:
    """Record other resources that name a CI, admin or team role (a key policy, a trust policy, a runner)."""
    watched = {d.arn: d for d in drafts if d.arn and d.kind in ("ci-apply", "ci-preview", "admin", "team-role")}
    if not watched:
        return
    for plan in env.plans:
        for r in plan.resources:
            if r["type"] in (ACCESS_ENTRY, ACCESS_POLICY) or not r["custom"]:
                continue
            text = json.dumps(r["inputs"])
            for arn, d in watched.items():
                if arn in text:
                    d.also.add(f"{plan.stack}: {r['type']} {r['name']}")


def summarise_actions(actions: Sequence[str], limit: int = 4) -> str:
    """`service: a, b, +n` per service, for the table."""
    by_service: dict[str, list[str]] = {}
    for action in actions:
        service, _, verb = action.partition(":")
        by_service.setdefault(service, []).append(verb or action)
    parts = []
    for service, verbs in sorted(by_service.items()):
        shown = ", ".join(verbs[:limit]) + (f", +{len(verbs) - limit}" if len(verbs) > limit else "")
        parts.append(f"{service}: {shown}")
    return "; ".join(parts)
