"""The fleet file: what exists (regions, environments, sites, node pools, teams), parsed into frozen models.

Pure planning code: no pulumi import. Every check that needs only the fleet itself lives here; address
overlaps need the lock too and live in `dlinfra.planner`.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from dlinfra.errors import FleetError
from dlinfra.model import eks
from dlinfra.model.naming import STANDARD_TAG_KEYS
from dlinfra.model.textcache import last_by_text

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$")]
"""Lower-case DNS-label-like name used in logical and physical names (2 to 24 characters)."""

PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# ASNs no BGP speaker may use: 0, AS_TRANS, documentation ranges (RFC 5398) and the last of each space.
_RESERVED_ASN_RANGES = ((0, 0), (23456, 23456), (64496, 64511), (65535, 65551), (4294967295, 4294967295))
# Amazon-side ASN of a transit gateway: a private ASN (AWS rule).
_AMAZON_ASN_RANGES = ((64512, 65534), (4200000000, 4294967294))
# Customer gateway BGP ASN range AWS accepts.
_CGW_ASN_MAX = 2147483647
# Hybrid nodes take one pod block each (Cilium's maskSize; dlinfra.hybrid_routing.NODE_POD_PREFIX says why /25).
_NODE_POD_PREFIX = 25
# SSM hybrid activation: at most 1000 machines register with one activation (AWS, CreateActivation RegistrationLimit).
_ACTIVATION_LIMIT = 1000
# Namespaces the cluster and its add-ons own; a team namespace there would share them.
RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "kueue-system"})

# Kubernetes object names and label syntax ("Object Names and IDs", "Labels and Selectors"): a qualified name is an
# optional DNS subdomain prefix (<= 253) and '/', then a name (<= 63) of alphanumerics, '-', '_', '.', starting and
# ending alphanumeric; a label value is such a name or empty. Taint keys and values follow the same rules.
_K8S_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# The kubelet refuses to start with labels of its own namespaces other than these (kubelet --node-labels).
_KUBELET_PREFIXES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def label_key_problem(key: str) -> str | None:
    """Why a string is not a Kubernetes label or taint key a node may register with, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r}: the prefix before '/' must be a lower-case DNS subdomain of at most 253 characters"
    if not _K8S_NAME.fullmatch(name):
        return (
            f"{key!r}: the name (after any '/') must be 1-63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit"
        )
    own = prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))
    if own and not prefix.endswith(_KUBELET_PREFIXES):
        return f"{key!r}: the kubelet only registers labels of kubernetes.io under {' or '.join(_KUBELET_PREFIXES)}"
    return None


# Node labels dlinfra sets itself from the fleet's structure: Kueue flavors and the autoscaler select pools by
# them, the NVIDIA device plugin and the cluster-autoscaler's GPU handling read the GPU ones, and the EFA device
# plugin's selector reads the last. A fleet label with one of these keys would silently change what they select.
# Other keys under dlinfra.io/ are the lab's own (the reference fleet labels training pools dlinfra.io/workload).
OWN_LABELS = frozenset(
    {
        "dlinfra.io/pool",
        "dlinfra.io/capacity",
        "dlinfra.io/team",
        "dlinfra.io/site",
        "nvidia.com/gpu.product",
        "k8s.amazonaws.com/accelerator",
        "vpc.amazonaws.com/efa.present",
    }
)


def own_label_problem(key: str) -> str | None:
    """Why a fleet node label may not use this key because dlinfra sets it, or None."""
    if key in OWN_LABELS:
        return (
            f"{key!r} is set by dlinfra from the pool's name, capacity, team, site, GPU and EFA settings; choose "
            f"another key (dlinfra's own: {', '.join(sorted(OWN_LABELS))})"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why a string is not a Kubernetes label or taint value, or None."""
    if value and not _K8S_NAME.fullmatch(value):
        return (
            f"{value!r} is not a Kubernetes label value: at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit (or empty)"
        )
    return None


def is_rfc1918(net: ipaddress.IPv4Network) -> bool:
    """True when the whole network lies inside one RFC 1918 private range."""
    return any(net.subnet_of(r) for r in PRIVATE_RANGES)


@dataclass(frozen=True)
class RegionInfo:
    """What AWS offers in one region: AZ names (in order) with zone ids, and reserved customer ASNs."""

    name: str
    azs: tuple[str, ...]
    zone_ids: Mapping[str, str]
    reserved_asns: frozenset[int]


@functools.cache
def known_regions() -> Mapping[str, RegionInfo]:
    """AWS regions dlinfra knows, from dlinfra/data/regions.yaml."""
    text = resources.files("dlinfra").joinpath("data/regions.yaml").read_text()
    raw = YAML(typ="safe").load(text)
    return {
        name: RegionInfo(
            name=name,
            azs=tuple(spec["azs"]),
            zone_ids=dict(spec["azs"]),
            reserved_asns=frozenset(spec.get("reserved_asns", ())),
        )
        for name, spec in raw.items()
    }


class Strict(BaseModel):
    """Base of every fleet model: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AddressSpace(Strict):
    """Where allocations come from and how large they are (prefix lengths)."""

    supernet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.0.0.0/8")  # RFC 1918 pool for everything
    vpc_prefix: int = Field(16, ge=16, le=28)  # default VPC size; AWS allows /16 to /28
    site_lan_prefix: int = Field(20, ge=16, le=28)  # size of a site LAN when the fleet gives none
    client_vpn_prefix: int = Field(22, ge=12, le=22)  # laptop VPN pool per region; Client VPN needs /22 or larger
    service_prefix: int = Field(20, ge=12, le=24)  # EKS service CIDR per cluster; EKS allows /12 to /24
    hybrid_pod_prefix: int = Field(18, ge=16, le=25)  # pod CIDR per physical site (EKS Hybrid Nodes); >= a node's /25

    @field_validator("supernet")
    @classmethod
    def _private(cls, v: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        if not is_rfc1918(v):
            raise ValueError(f"{v} is not inside an RFC 1918 range (10/8, 172.16/12, 192.168/16)")
        return v


class RegionSpec(Strict):
    """A region the fleet uses."""

    primary: bool = False  # exactly one region is primary (global control, default home)
    azs: int = Field(3, le=6)  # availability zones used in this region; EKS needs two or more

    @field_validator("azs")
    @classmethod
    def _two_for_eks(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"{v}: every region runs an EKS cluster, and EKS needs subnets in at least two AZs")
        return v


# Taints that keep new work off a node about to go: the node termination handler's (it puts them on a node when
# it learns of maintenance, a spot interruption, a rebalance or an ASG termination) and the cordon's. Work that
# tolerates one of them still lands on such a node. Source: aws-node-termination-handler v1.25.6 (the version
# addons.yaml pins), pkg/node/node.go, the *Taint constants; Kubernetes "Taints and Tolerations" (cordoned nodes
# carry node.kubernetes.io/unschedulable:NoSchedule).
DRAIN_TAINT_PREFIX = "aws-node-termination-handler/"
DRAIN_TAINT_KEYS = (
    f"{DRAIN_TAINT_PREFIX}scheduled-maintenance",
    f"{DRAIN_TAINT_PREFIX}spot-itn",
    f"{DRAIN_TAINT_PREFIX}asg-lifecycle-termination",
    f"{DRAIN_TAINT_PREFIX}rebalance-recommendation",
    "node.kubernetes.io/unschedulable",
)


class Taint(Strict):
    """A Kubernetes taint put on a pool's nodes."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _not_a_drain_taint(cls, v: str) -> str:
        problem = label_key_problem(v)
        if problem:
            raise ValueError(f"not a Kubernetes taint key: {problem}")
        # Kueue makes a pool's taints ones its jobs must tolerate: jobs would then ignore the handler's taint.
        if v.startswith(DRAIN_TAINT_PREFIX) or v in DRAIN_TAINT_KEYS:
            raise ValueError(
                f"{v!r} is the termination handler's or the cordon's taint: jobs on the pool would have to tolerate "
                "it, and would then start on nodes about to go into maintenance; choose another key"
            )
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: str) -> str:
        problem = label_value_problem(v)
        if problem:
            raise ValueError(problem.replace("label value", "taint value"))
        return v


class CapacityReservation(Strict):
    """An EC2 capacity reservation or capacity block a pool targets in one region."""

    id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$")  # capacity reservation id
    az: str  # the AZ the reservation lives in; must be the pool's AZ
    type: Literal["reservation", "capacity_block"] = "reservation"


class SpotSpec(Strict):
    """Mixed-instances split: an on-demand base, the rest spot."""

    on_demand_base: int = Field(0, ge=0)  # instances always on demand
    on_demand_percentage_above_base: int = Field(0, ge=0, le=100)  # percent on demand above the base
    allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized", "lowest-price"] = (
        "price-capacity-optimized"
    )


class NodePool(Strict):
    """An Auto Scaling group of GPU or CPU nodes, present in some or all regions of its environment."""

    kind: Literal["gpu", "cpu"]
    instance_types: tuple[str, ...] = Field(min_length=1)  # first is preferred; GPU pools: GPU types only
    min_size: int = Field(0, ge=0)  # per region
    max_size: int = Field(ge=0)  # per region
    regions: tuple[str, ...] | None = None  # default: every region of the environment
    zones: Mapping[str, tuple[str, ...]] = Field(default_factory=dict)  # region -> AZ names; EFA pools: one
    efa: bool = False  # EFA interfaces + cluster placement group + single AZ
    capacity_reservations: Mapping[str, CapacityReservation] = Field(default_factory=dict)  # region -> target
    spot: SpotSpec | None = None  # CPU pools: mixed instances with spot
    labels: Mapping[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    pod_imds_access: bool = False  # hop limit 2 lets pods reach IMDS; default 1 keeps it node-only
    root_volume_gib: int = Field(200, ge=20, le=16384)

    # regions, zones and taints are sets, unlike instance_types: their order in the file changes nothing declared.
    @field_validator("regions")
    @classmethod
    def _region_set(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else tuple(sorted(v))

    @field_validator("zones")
    @classmethod
    def _zone_sets(cls, v: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        return {region: tuple(sorted(zones)) for region, zones in v.items()}

    @field_validator("taints")
    @classmethod
    def _taint_set(cls, v: tuple[Taint, ...]) -> tuple[Taint, ...]:
        return tuple(sorted(v, key=lambda t: (t.key, t.value, t.effect)))

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: Mapping[str, str]) -> Mapping[str, str]:
        for key, value in v.items():
            problem = label_key_problem(key) or own_label_problem(key) or label_value_problem(value)
            if problem:
                raise ValueError(f"node label {problem}")
        return v

    @model_validator(mode="after")
    def _sizes(self) -> NodePool:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size {self.min_size} is greater than max_size {self.max_size}")
        if self.spot is not None and self.kind == "gpu":
            raise ValueError("spot: GPU pools run on demand or on reserved capacity; spot is for CPU pools")
        return self


class KubernetesSpec(Strict):
    """EKS settings for every cluster of an environment."""

    version: str = Field("1.33", pattern=r"^1\.\d{2}$")  # EKS minor version
    # What EKS does at the end of standard support: upgrade the cluster (standard) or keep it on paid extended
    # support for 12 more months (extended). Required: each choice has a cost, and dlinfra checks the dates.
    upgrade_policy: Literal["standard", "extended"] | None = None
    admin_role_arns: tuple[str, ...] = ()  # IAM roles given cluster-admin access entries
    public_access_cidrs: tuple[ipaddress.IPv4Network, ...] = ()  # empty: private endpoint only

    @field_validator("admin_role_arns")
    @classmethod
    def _arns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for arn in v:
            if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", arn):
                raise ValueError(f"{arn!r} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)")
        return tuple(sorted(v))  # order in the file changes nothing declared

    @field_validator("public_access_cidrs")
    @classmethod
    def _cidr_set(cls, v: tuple[ipaddress.IPv4Network, ...]) -> tuple[ipaddress.IPv4Network, ...]:
        return tuple(sorted(v))  # a set of networks: the EKS endpoint's allow list is declared in address order


_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_CONNECTION_ARN = re.compile(
    r"arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[\w-]+"
)
_GITHUB_REPOSITORY = re.compile(r"https://github\.com/[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}")


class CiSpec(Strict):
    """How CI applies and previews an environment's stacks (apply.yml, preview.yml)."""

    # Role apply.yml assumes by OIDC; gets a cluster-admin EKS access entry so the in-cluster stacks apply.
    apply_role_arn: str
    # Read-only role the preview workflows assume; gets a view-only EKS access entry (no Secrets).
    preview_role_arn: str
    # Repository whose workflow jobs the in-VPC runner takes (https://github.com/<owner>/<repo>).
    repository: str
    # AWS CodeConnections connection to GitHub that the runner's CodeBuild project uses.
    connection_arn: str
    # Real `pulumi preview` of this environment's stacks on pull requests: the preview credential can then
    # decrypt this environment's state, so leave it false where the state holds secrets that matter (prod).
    pull_request_preview: bool = False

    @field_validator("apply_role_arn", "preview_role_arn")
    @classmethod
    def _role(cls, v: str) -> str:
        if not _ROLE_ARN.fullmatch(v):
            raise ValueError(f"{v!r} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)")
        return v

    @model_validator(mode="after")
    def _two_roles(self) -> CiSpec:
        if self.apply_role_arn == self.preview_role_arn:
            raise ValueError(
                f"preview_role_arn is the apply role ({self.apply_role_arn}): previews must not hold the credential "
                "that applies"
            )
        return self

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _GITHUB_REPOSITORY.fullmatch(v):
            raise ValueError(f"{v!r} is not a GitHub repository URL (https://github.com/<owner>/<repo>)")
        return v

    @field_validator("connection_arn")
    @classmethod
    def _connection(cls, v: str) -> str:
        if not _CONNECTION_ARN.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a CodeConnections ARN (arn:aws:codeconnections:<region>:<12 digits>:connection/<id>)"
            )
        return v


_SAML_PROVIDER_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:saml-provider/[\w+=,.@-]{1,128}")
_PERSON = re.compile(r"[a-z][a-z0-9._-]{0,62}")


class SamlSpec(Strict):
    """Laptop VPN by federated sign-in (SAML 2.0, e.g. IAM Identity Center): people, not shared keys."""

    provider_arn: str  # IAM SAML identity provider for the VPN (arn:aws:iam::<account>:saml-provider/<name>)
    self_service_provider_arn: str | None = None  # a second IAM SAML provider for the self-service portal
    admin_group: str | None = None  # IdP group whose members reach everything the endpoint routes

    @field_validator("provider_arn", "self_service_provider_arn")
    @classmethod
    def _arn(cls, v: str | None) -> str | None:
        if v is not None and not _SAML_PROVIDER_ARN.fullmatch(v):
            raise ValueError(f"{v!r} is not an IAM SAML provider ARN (arn:aws:iam::<12 digits>:saml-provider/<name>)")
        return v


class ClientVpnSpec(Strict):
    """How people authenticate to the environment's laptop VPN: federated (saml) or per-person certificates."""

    saml: SamlSpec | None = None  # federated sign-in; teams with `vpn_group` reach the networks, per group
    users: tuple[str, ...] = ()  # otherwise: one certificate per person; removing a name revokes it

    @field_validator("users")
    @classmethod
    def _people(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for user in v:
            if not _PERSON.fullmatch(user):
                raise ValueError(f"{user!r} is not a user name (lower-case letters, digits, '.', '_', '-')")
        if len(set(v)) != len(v):
            raise ValueError("a user is listed twice")
        return tuple(sorted(v))  # order in the file changes nothing declared

    @model_validator(mode="after")
    def _one_mode(self) -> ClientVpnSpec:
        if (self.saml is None) == (not self.users):
            raise ValueError("give exactly one of saml (federated sign-in) or users (per-person certificates)")
        return self


class FsxSpec(Strict):
    """FSx for Lustre scratch linked to the datasets bucket."""

    storage_capacity_gib: int = Field(1200, ge=1200)  # PERSISTENT_2: 1200 or a multiple of 2400
    throughput_per_tib: Literal[125, 250, 500, 1000] = 250

    @field_validator("storage_capacity_gib")
    @classmethod
    def _increment(cls, v: int) -> int:
        if v != 1200 and v % 2400:
            raise ValueError(f"{v} GiB is not valid for PERSISTENT_2: use 1200 or a multiple of 2400")
        return v


class StorageSpec(Strict):
    """Shared storage of an environment's regional stacks."""

    fsx: FsxSpec | None = None  # None: no Lustre scratch
    checkpoint_retention_days: int = Field(90, ge=1)  # noncurrent checkpoint versions kept this long


class EnvironmentRegion(Strict):
    """One region of one environment: a regional stack `<env>-<region>`."""

    vpc_cidr: ipaddress.IPv4Network | None = None  # explicit VPC block; else allocated
    client_vpn_cidr: ipaddress.IPv4Network | None = None  # explicit laptop VPN pool; else allocated
    transit_asn: int = 64512  # Amazon-side ASN of this region's transit gateway

    @field_validator("transit_asn")
    @classmethod
    def _amazon_asn(cls, v: int) -> int:
        if not any(lo <= v <= hi for lo, hi in _AMAZON_ASN_RANGES):
            raise ValueError(f"{v} is not a private ASN (64512-65534 or 4200000000-4294967294)")
        return v


class Environment(Strict):
    """An environment (prod, staging): its regions, NAT mode, cluster, storage and node pools."""

    regions: Mapping[str, EnvironmentRegion] = Field(min_length=1)
    nat: Literal["per_az", "single"] = "per_az"  # NAT gateway per AZ (resilient) or one (cheap)
    vpc_prefix: int | None = Field(None, ge=16, le=28)  # overrides address_space.vpc_prefix
    # A Client VPN endpoint in each region and how people sign in to it; None (or false): no laptop VPN.
    client_vpn: ClientVpnSpec | None = None
    # Team GPU quotas here: guarantees that must fit the environment's GPUs, or scaled down to fit them.
    gpu_quotas: Literal["guaranteed", "scaled"] = "guaranteed"
    kubernetes: KubernetesSpec = KubernetesSpec()
    storage: StorageSpec = StorageSpec()
    node_pools: Mapping[Name, NodePool] = Field(default_factory=dict)
    ci: CiSpec | None = None  # None: no in-VPC runner or CI access entries; admins apply over the laptop VPN

    @field_validator("client_vpn", mode="before")
    @classmethod
    def _client_vpn(cls, v: Any) -> Any:
        if v is False:
            return None
        if v is True:
            raise ValueError(
                "say how people sign in: `saml: {provider_arn: ...}` (federated) or `users: [...]` (a certificate "
                "each); a key shared by every laptop can't be revoked"
            )
        return v

    @field_validator("regions", mode="before")
    @classmethod
    def _empty_entries(cls, v: Any) -> Any:
        # `us-west-2:` with nothing after it means "this region, all defaults".
        if isinstance(v, Mapping):
            return {k: ({} if spec is None else spec) for k, spec in v.items()}
        return v


class NfsMount(Strict):
    """An NFS export the site's GPU nodes mount."""

    server: ipaddress.IPv4Address
    export: str = Field(pattern=r"^/")
    mount_point: str = Field(pattern=r"^/")


class Site(Strict):
    """A physical GPU site joined by IPsec to its home region's transit gateway."""

    region: str  # home region
    environment: str = "prod"  # whose transit gateways and cluster it joins
    public_ip: ipaddress.IPv4Address  # the site gateway's public address (customer gateway)
    asn: int = 65000  # site BGP ASN (also required by AWS for static routing)
    routing: Literal["static", "bgp"] = "static"
    # How the site gateway's tunnels carry traffic. "route" (AWS's model): an XFRM interface per tunnel and
    # routing over both. "policy" only for gateways that cannot do that (Linux < 4.19 has no XFRM interfaces;
    # appliances without route-based VPN): one tunnel carries traffic at a time (docs/site-onboarding.md).
    tunnel_mode: Literal["route", "policy"] = "route"
    lan: ipaddress.IPv4Network | None = None  # explicit site LAN; else allocated
    pod_cidr: ipaddress.IPv4Network | None = None  # explicit pod CIDR of its hybrid nodes; else allocated
    gpu_nodes: int = Field(0, ge=0, le=_ACTIVATION_LIMIT)  # machines that join as hybrid nodes (one SSM activation)
    gpus_per_node: int = Field(8, ge=0)
    gpu_model: str = "H100"
    nfs: tuple[NfsMount, ...] = ()  # a set: mounted in mount point order, so a parent mounts before its children
    # Until when the site's SSM hybrid activation registers new machines (UTC, at most 30 days after the apply
    # that creates it; default: AWS's 24 hours). A fixed instant, so previews stay stable; changing it creates
    # a new activation with a new code, and machines already registered keep working.
    activation_expiry: datetime.datetime | None = None

    @field_validator("nfs")
    @classmethod
    def _mount_order(cls, v: tuple[NfsMount, ...]) -> tuple[NfsMount, ...]:
        return tuple(sorted(v, key=lambda m: (m.mount_point, str(m.server), m.export)))

    @field_validator("activation_expiry")
    @classmethod
    def _utc(cls, v: datetime.datetime | None) -> datetime.datetime | None:
        if v is not None and v.utcoffset() is None:
            raise ValueError(f"{v.isoformat()} has no time zone: write it in UTC, e.g. 2026-12-20T00:00:00Z")
        return v

    @field_validator("gpu_model")
    @classmethod
    def _label_value(cls, v: str) -> str:
        problem = label_value_problem(v)  # nodes carry it as nvidia.com/gpu.product, Kueue flavors select on it
        if problem or not v:
            raise ValueError(problem or "required: the GPU model, e.g. H100")
        return v

    @field_validator("public_ip")
    @classmethod
    def _public(cls, v: ipaddress.IPv4Address) -> ipaddress.IPv4Address:
        if not v.is_global or v.is_multicast:
            raise ValueError(f"{v} is not a public address (private, reserved or special-purpose)")
        return v

    @field_validator("asn")
    @classmethod
    def _asn(cls, v: int) -> int:
        if not 1 <= v <= _CGW_ASN_MAX:
            raise ValueError(f"{v} is out of range: AWS customer gateways take 1 to {_CGW_ASN_MAX}")
        if any(lo <= v <= hi for lo, hi in _RESERVED_ASN_RANGES):
            raise ValueError(f"{v} is a reserved ASN (AS_TRANS, documentation or last-of-range)")
        return v


class Team(Strict):
    """A research team: its namespace, IAM role and GPU quota."""

    gpu_quota: int = Field(ge=0)  # GPUs guaranteed to the team across the fleet (Kueue nominal quota)
    cpu_quota: int = Field(0, ge=0)  # vCPUs guaranteed; 0: no CPU guarantee
    role_arn: str | None = None  # IAM role whose sessions act as the team in Kubernetes
    namespace: Name | None = None  # default: team-<name>
    # The team's group in the VPN's SAML identity provider (IAM Identity Center: the group id): with federated
    # laptop VPN, its members reach the networks. Not used with per-person certificates (no groups in TLS).
    vpn_group: str | None = Field(None, min_length=1, max_length=255)
    # Regions the team's jobs may overflow to from the environment's manager region (Kueue MultiKueue), when
    # submitted to its `overflow` queue; a set: MultiKueue offers a job to all of them at once, and the first to
    # admit it runs it. Empty: the team's jobs stay in the region they are submitted to.
    overflow: tuple[str, ...] = ()

    @field_validator("overflow")
    @classmethod
    def _overflow_set(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a region twice: {', '.join(sorted(r for r in set(v) if v.count(r) > 1))}")
        return tuple(sorted(v))

    @field_validator("role_arn")
    @classmethod
    def _arn(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", v):
            raise ValueError(f"{v!r} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)")
        return v


class Fleet(Strict):
    """The whole fleet: the single source of truth every stack reads."""

    project: Name = "dlinfra"
    tags: Mapping[str, str] = Field(default_factory=dict)  # fleet-wide tags (cost centre, owner)
    address_space: AddressSpace = AddressSpace()
    regions: Mapping[str, RegionSpec] = Field(min_length=1)
    environments: Mapping[Name, Environment] = Field(min_length=1)
    sites: Mapping[Name, Site] = Field(default_factory=dict)
    teams: Mapping[Name, Team] = Field(default_factory=dict)

    @field_validator("regions", mode="before")
    @classmethod
    def _empty_regions(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: ({} if spec is None else spec) for k, spec in v.items()}
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: Mapping[str, str]) -> Mapping[str, str]:
        for key, value in v.items():
            if key in STANDARD_TAG_KEYS or key == "Name":
                raise ValueError(f"tag {key!r} is set by dlinfra on every resource; choose another key")
            if key.lower().startswith("aws:") or not 1 <= len(key) <= 128 or len(str(value)) > 256:
                raise ValueError(f"tag {key!r}: keys are 1-128 characters, not starting aws:, values <= 256")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        for problem in _cross_checks(self):
            raise problem
        return self

    # Derived views used by every later layer.
    @property
    def primary_region(self) -> str:
        """The region marked primary."""
        return next(name for name, spec in self.regions.items() if spec.primary)

    def azs(self, region: str) -> tuple[str, ...]:
        """The AZ names this fleet uses in a region (the first N the region offers)."""
        return known_regions()[region].azs[: self.regions[region].azs]

    def vpc_prefix(self, env: str) -> int:
        """VPC prefix length of an environment."""
        return self.environments[env].vpc_prefix or self.address_space.vpc_prefix

    def regional_stacks(self) -> Iterator[tuple[str, str]]:
        """Every (environment, region) pair, in fleet order."""
        for env_name, env in self.environments.items():
            for region in env.regions:
                yield env_name, region

    def pools_in(self, env: str, region: str) -> dict[str, NodePool]:
        """Node pools of an environment that run in a region."""
        pools = self.environments[env].node_pools
        return {n: p for n, p in pools.items() if p.regions is None or region in p.regions}

    def pool_types(self, env: str, region: str, pool_name: str) -> tuple[str, ...]:
        """A pool's instance types that are sold in a region, in the fleet's order of preference.

        A pool lists types by preference; where the first is not sold (p5 and g6 are not in eu-west-1), the
        region's launch template takes the first one that is. Validation refuses a pool left with none.
        """
        from dlinfra.model import instances

        pool = self.environments[env].node_pools[pool_name]
        if region in pool.capacity_reservations:  # reserved capacity is there whatever the on-demand lists say
            return pool.instance_types
        return tuple(t for t in pool.instance_types if instances.offered(t, region))

    def pool_zones(self, env: str, region: str, pool_name: str) -> tuple[str, ...]:
        """AZs a pool uses in a region: as the fleet says, else one AZ for EFA pools, else every AZ."""
        pool = self.environments[env].node_pools[pool_name]
        if region in pool.zones:
            return tuple(pool.zones[region])
        if region in pool.capacity_reservations:
            return (pool.capacity_reservations[region].az,)
        return self.azs(region)[:1] if pool.efa else self.azs(region)

    def sites_of(self, env: str, region: str | None = None) -> dict[str, Site]:
        """Sites joined to an environment, optionally only those homed on one region."""
        return {n: s for n, s in self.sites.items() if s.environment == env and (region is None or s.region == region)}

    def team_namespace(self, team: str) -> str:
        """Kubernetes namespace of a team."""
        return self.teams[team].namespace or f"team-{team}"

    def multikueue_manager(self, env: str) -> str:
        """The region whose cluster dispatches overflowing jobs (MultiKueue manager): the primary region, or the
        environment's first region by name when the environment does not run in the primary region."""
        regions = self.environments[env].regions
        return self.primary_region if self.primary_region in regions else sorted(regions)[0]

    def overflow_regions(self, env: str, team: str) -> tuple[str, ...]:
        """Regions of an environment a team's overflow queue dispatches to (its workers there), sorted."""
        manager, regions = self.multikueue_manager(env), self.environments[env].regions
        return tuple(r for r in self.teams[team].overflow if r in regions and r != manager)

    def multikueue_workers(self, env: str) -> tuple[str, ...]:
        """Regions of an environment some team overflows to: their clusters are MultiKueue workers."""
        return tuple(sorted({r for team in self.teams for r in self.overflow_regions(env, team)}))


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
    namespaces: dict[str, str] = {}
    for team in fleet.teams:
        ns = fleet.team_namespace(team)
        if ns in RESERVED_NAMESPACES:
            yield FleetError(f"namespace {ns!r} belongs to the cluster; choose another", key=f"teams.{team}.namespace")
        if ns in namespaces:
            yield FleetError(f"namespace {ns!r} is also team {namespaces[ns]!r}'s", key=f"teams.{team}.namespace")
        namespaces[ns] = team


def _site_checks(fleet: Fleet) -> Iterator[FleetError]:
    """What `site add` refuses, refused in the file too: shared gateways, ASNs that clash, pod ranges too small."""
    gateways: dict[str, str] = {}
    asns: dict[tuple[str, int], str] = {}
    for name, site in fleet.sites.items():
        key = f"sites.{name}"
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
        for region in pool.regions or ():
            if region not in env.regions:
                yield FleetError(f"region {region!r} is not a region of environment {env_name!r}", key=f"{key}.regions")
                return
        yield from _instance_checks(key, pool)
        used = pool.regions or tuple(env.regions)
        yield from _offering_checks(key, pool, [r for r in used if r not in pool.capacity_reservations])
        for region, zones in pool.zones.items():
            if region not in used:
                yield FleetError(f"pool does not run in {region!r}", key=f"{key}.zones.{region}")
                return
            bad = [z for z in zones if z not in fleet.azs(region)]
            if bad:
                yield FleetError(
                    f"{', '.join(bad)} not among the AZs the fleet uses in {region} ({', '.join(fleet.azs(region))})",
                    key=f"{key}.zones.{region}",
                )
            if pool.efa and len(zones) != 1:
                yield FleetError(
                    f"an EFA pool lives in one AZ (one cluster placement group); got {len(zones)}: {', '.join(zones)}",
                    key=f"{key}.zones.{region}",
                )
        for region, cr in pool.capacity_reservations.items():
            if region not in used:
                yield FleetError(f"pool does not run in {region!r}", key=f"{key}.capacity_reservations.{region}")
                return
            zones = fleet.pool_zones(env_name, region, pool_name)
            if cr.az not in zones:
                yield FleetError(
                    f"reservation {cr.id} is in {cr.az} but the pool runs in {', '.join(zones)}",
                    key=f"{key}.capacity_reservations.{region}.az",
                )


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


@dataclass(frozen=True)
class LoadedFleet:
    """A parsed fleet with where it came from, so later errors can name the file."""

    fleet: Fleet
    path: Path


def _yaml_line(data: Any, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest key of `loc` that the round-trip YAML tree knows."""
    line = None
    node = data
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
        else:
            break
    return line


def parse_yaml(path: Path) -> Any:
    """Round-trip YAML load that rejects duplicate keys and reports parse errors with a line."""
    yaml = YAML(typ="rt")
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetError(f"cannot read: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = (exc.problem or exc.context or "malformed YAML").strip()
        if "duplicate key" in str(exc):
            problem = f"duplicate key: {str(exc).split('found duplicate key', 1)[-1].split(chr(10))[0].strip()}"
        raise FleetError(f"malformed YAML at {where}: {problem}", file=str(path)) from None


def version_lifecycle(loaded: LoadedFleet, on: datetime.date) -> list[str]:
    """Warnings for cluster versions near the end of their support; FleetError for one past it.

    Time-dependent, so not part of the model: the CLI and the stack program call it with today's date.
    """
    warnings = []
    for env_name, env in loaded.fleet.environments.items():
        assert env.kubernetes.upgrade_policy is not None  # the model requires it
        state = eks.lifecycle(env.kubernetes.version, env.kubernetes.upgrade_policy, on)
        key = f"environments.{env_name}.kubernetes.version"
        if state.level == "error":
            raise FleetError(state.message, file=str(loaded.path), key=key)
        if state.level == "warning":
            warnings.append(f"{loaded.path}: {key}: {state.message}")
    return warnings


def load_fleet(path: str | Path) -> LoadedFleet:
    """Parse and validate a fleet file; raises FleetError naming the file and key."""
    path = Path(path)
    return LoadedFleet(fleet=_fleet_of(path), path=path)


@last_by_text
def _fleet_of(path: Path) -> Fleet:
    return validate_data(parse_yaml(path), path)  # parse_yaml reports an unreadable file


def validate_data(data: Any, path: Path) -> Fleet:
    """The fleet model of parsed fleet data (as read, or as a command is about to write it), or the FleetError
    naming the file, line, key and value: every command refuses a fleet in the same words."""
    if not isinstance(data, Mapping):
        raise FleetError("the top level must be a mapping (project, regions, environments, ...)", file=str(path))
    from dlinfra.model import kueue  # it plans from the models defined here

    try:
        fleet = Fleet.model_validate(data)
        kueue.check_fleet(fleet, source=str(path))  # quotas span environments: every command refuses them first
    except ValidationError as exc:
        raise _fleet_error(path, data, exc) from None
    except FleetError as exc:
        line = _yaml_line(data, (exc.key or "").split(".")) if exc.key else None
        raise FleetError(exc.detail, file=f"{path}:{line}" if line else str(path), key=exc.key) from None
    return fleet


_ECHO_LIMIT = 60  # characters of a bad value repeated in an error


def _echo(value: Any, message: str) -> str:
    """` (got <value>)` for a scalar the message does not already show, truncated; else nothing."""
    if isinstance(value, Mapping | list | tuple) or str(value) in message:
        return ""
    shown = repr(value)
    return f" (got {shown[: _ECHO_LIMIT - 3]}...)" if len(shown) > _ECHO_LIMIT else f" (got {shown})"


def _fleet_error(path: Path, data: Any, exc: ValidationError) -> FleetError:
    messages = []
    first_key = None
    bad_names: set[str] = set()
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained")))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if any(key.startswith(f"{k}.") for k in bad_names):
            continue  # the entry's name is already reported; its body errors would only add noise
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see README 'Fleet file reference')"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
            key = ".".join(str(p) for p in loc)
            msg = "not a valid name: names are 2-24 lower-case letters, digits and '-', starting with a letter"
        if msg.startswith("not a valid name"):
            bad_names.add(key)
        elif err["type"] not in ("missing", "extra_forbidden"):
            msg += _echo(err.get("input"), msg)
        line = _yaml_line(data, loc)
        messages.append(f"{path}:{line}: {key}: {msg}" if line else f"{path}: {key}: {msg}")
        first_key = first_key or key
    error = FleetError("\n".join(messages))
    error.file, error.key = str(path), first_key
    return error
