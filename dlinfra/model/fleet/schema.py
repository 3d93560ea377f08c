"""The fleet's models: regions, environments, node pools, sites and teams as frozen pydantic models, each field
checked on its own, and the derived views every later layer reads (pools in a region, a pool's zones, ...)."""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from dlinfra.model import job_operators
from dlinfra.model.fleet.base import Name, Strict
from dlinfra.model.fleet.devboxes import DevBoxes
from dlinfra.model.fleet.images import StandardImages
from dlinfra.model.fleet.labels import (
    label_value_problem,
)
from dlinfra.model.fleet.pools import GpuCheck, NodePool
from dlinfra.model.naming import STANDARD_TAG_KEYS
from dlinfra.model.quotas import QuotaValues, check_codes
from dlinfra.model.regions import known_regions

PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# ASNs no BGP speaker may use: 0, AS_TRANS, documentation ranges (RFC 5398) and the last of each space.
_RESERVED_ASN_RANGES = ((0, 0), (23456, 23456), (64496, 64511), (65535, 65551), (4294967295, 4294967295))
# Amazon-side ASN of a transit gateway: a private ASN (AWS rule).
_AMAZON_ASN_RANGES = ((64512, 65534), (4200000000, 4294967294))
# Customer gateway BGP ASN range AWS accepts.
_CGW_ASN_MAX = 2147483647
# SSM hybrid activation: at most 1000 machines register with one activation (AWS, CreateActivation RegistrationLimit).
_ACTIVATION_LIMIT = 1000
# Namespaces the cluster and its add-ons own; a team namespace there would share them.
RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "kueue-system"})
# Namespaces that hold no controller of their own (Kubernetes docs "Namespaces": the initial namespaces).
_SHARED_NAMESPACES = frozenset({"default", "kube-public", "kube-node-lease"})
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_rfc1918(net: ipaddress.IPv4Network) -> bool:
    """True when the whole network lies inside one RFC 1918 private range."""
    return any(net.subnet_of(r) for r in PRIVATE_RANGES)


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
    quotas: QuotaValues = Field(default_factory=dict)  # raised here; overrides the fleet's `quotas`

    @field_validator("quotas")
    @classmethod
    def _quota_codes(cls, v: QuotaValues) -> QuotaValues:
        return check_codes(v)

    @field_validator("azs")
    @classmethod
    def _two_for_eks(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"{v}: every region runs an EKS cluster, and EKS needs subnets in at least two AZs")
        return v


class KubernetesSpec(Strict):
    """EKS settings for every cluster of an environment."""

    version: str = Field("1.33", pattern=r"^1\.\d{2}$")  # EKS minor version
    # What EKS does at the end of standard support: upgrade the cluster (standard) or keep it on paid extended
    # support for 12 more months (extended). Required: each choice has a cost, and dlinfra checks the dates.
    upgrade_policy: Literal["standard", "extended"] | None = None
    admin_role_arns: tuple[str, ...] = ()  # IAM roles given cluster-admin access entries
    public_access_cidrs: tuple[ipaddress.IPv4Network, ...] = ()  # empty: private endpoint only
    # Job operators the lab installs itself (dlinfra.model.job_operators: jobset, kubeflow-trainer, kuberay, ...),
    # each with the namespace its controller runs in: Kueue queues their job kinds, and the admission policies trust
    # pods and child jobs made by service accounts of those namespaces. Empty: batch Jobs (and queued Pods,
    # Deployments, StatefulSets) only.
    job_operators: Mapping[str, str] = Field(default_factory=dict)

    @field_validator("admin_role_arns")
    @classmethod
    def _arns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for arn in v:
            if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", arn):
                raise ValueError(f"{arn!r} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)")
        return tuple(sorted(v))  # order in the file changes nothing declared

    @field_validator("job_operators")
    @classmethod
    def _operators(cls, v: Mapping[str, str]) -> Mapping[str, str]:
        for name, namespace in v.items():
            operator = job_operators.OPERATORS.get(name)
            if operator is None:
                raise ValueError(f"unknown job operator {name!r}; known: {', '.join(job_operators.OPERATORS)}")
            if not _NAMESPACE.fullmatch(namespace):
                raise ValueError(f"{name}: {namespace!r} is not a namespace name (a DNS label: RFC 1123)")
            if namespace in _SHARED_NAMESPACES:
                raise ValueError(
                    f"{name}: {namespace!r} is no operator's own namespace; every service account there would be "
                    "trusted to make GPU pods outside the queues"
                )
            missing = [r for r in operator.requires if r not in v]
            if missing:
                raise ValueError(f"{name} creates the kinds of {', '.join(missing)}: name that operator too")
        return dict(sorted(v.items()))  # order in the file changes nothing declared

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
    # GitHub account ids (the numeric `id` of api.github.com/users/<login>) whose workflow jobs the in-VPC runners
    # take; required, at least one. With the exact workflow name it is the only filter CodeBuild documents for a
    # queued workflow job (API reference, "WebhookFilter": HEAD_REF works with push and pull-request events only),
    # so it is what keeps a fork's pull request, from any branch name, off the runners (CodeBuild user guide,
    # "Best practices for using webhooks": ACTOR_ACCOUNT_ID filters).
    runner_actor_ids: tuple[Annotated[int, Field(strict=True, ge=1)], ...]

    @field_validator("runner_actor_ids")
    @classmethod
    def _actor_ids(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError(
                "needs at least one GitHub account id (api.github.com/users/<login> .id): the runners take only "
                "jobs those accounts start"
            )
        if len(set(v)) != len(v):
            raise ValueError(f"{sorted(i for i in set(v) if v.count(i) > 1)} listed twice")
        return v

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
# A person's name (a laptop VPN user, a team member: the same people) becomes part of Kubernetes object names: the
# claim home-<person> and its PersistentVolume home-<person>-<namespace> (dlinfra.model.team_storage,
# components/team_volumes.py), which must be DNS-1123 subdomains (Kubernetes docs "Object Names and IDs": lower-case
# alphanumerics, '-' and '.', each dot-separated part starting and ending with an alphanumeric). So no '_', and
# neither a trailing '-' or '.' nor one next to a '.': `john_doe` would pass here and then fail the apply.
_PERSON = re.compile(r"[a-z](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
_PERSON_MAX = 63


def person_name(v: str) -> str:
    """A person's name that Kubernetes accepts inside a claim's and a volume's name (see _PERSON)."""
    if len(v) > _PERSON_MAX or not _PERSON.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a user name Kubernetes can use in the claim home-{v}: up to {_PERSON_MAX} lower-case "
            "letters, digits, '-' and '.', starting with a letter and ending with a letter or digit, with a letter "
            "or digit on each side of every '.' (no '_'; write john.doe or john-doe for john_doe)"
        )
    return v


Person = Annotated[str, AfterValidator(person_name)]


def access_group_id(v: str) -> str:
    """An IdP group id a Client VPN authorization rule can name: the AWS provider refuses a comma in
    access_group_id, since it joins endpoint, CIDR and group with commas into the rule's id
    (terraform-provider-aws ec2/vpnclient_authorization_rule.go)."""
    if "," in v:
        raise ValueError(f"{v!r} holds a comma, which an authorization rule's access_group_id may not")
    return v


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

    @field_validator("admin_group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        return None if v is None else access_group_id(v)


class ClientVpnSpec(Strict):
    """How people authenticate to the environment's laptop VPN: federated (saml) or per-person certificates."""

    saml: SamlSpec | None = None  # federated sign-in; teams with `vpn_group` reach the networks, per group
    users: tuple[Person, ...] = ()  # otherwise: one certificate per person; removing a name revokes it

    @field_validator("users")
    @classmethod
    def _people(cls, v: tuple[str, ...]) -> tuple[str, ...]:
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
    # What GPU nodes carry as nvidia.com/gpu.product: NVIDIA's product name (as NVIDIA's feature discovery writes it),
    # or "short", dlinfra's short model name, as before 2026-11: for an environment whose admitted jobs still select
    # that value, until `dlinfra gpu labels` finds none (docs/gpu-health.md, "Labels").
    gpu_product_label: Literal["nvidia", "short"] = "nvidia"
    kubernetes: KubernetesSpec = KubernetesSpec()
    storage: StorageSpec = StorageSpec()
    node_pools: Mapping[Name, NodePool] = Field(default_factory=dict)
    ci: CiSpec | None = None  # None: no in-VPC runner or CI access entries; admins apply over the laptop VPN
    dev_boxes: DevBoxes = DevBoxes()  # people's interactive machines (dlinfra.model.fleet.devboxes, docs/dev-boxes.md)
    # The AWS account its stacks apply to: environments with the same account share its per-region quotas. None:
    # the one account every environment without an account shares (the safe assumption for counting quotas).
    account: str | None = Field(None, pattern=r"^\d{12}$")

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
    # The NVML product name its GPUs report ("NVIDIA A100-SXM4-80GB"), one of the model's in gpu_models.yaml: the
    # machines' nvidia.com/gpu.product label and what their burn-in expects. Needed only where the model comes as more
    # than one product (A100: 40GB or 80GB); else the model's.
    gpu_product: str | None = None
    gpu_check: GpuCheck = Field(default_factory=GpuCheck)  # the burn-in its GPU machines run at every boot
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
        problem = label_value_problem(v)  # nodes carry it as dlinfra.io/gpu-model, Kueue flavors select on it
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
    # People of the team (laptop-VPN user names): each gets a home directory on EFS, mounted in the team's
    # namespace as the claim home-<person> (dlinfra.model.team_storage). A set: order changes nothing.
    members: tuple[Person, ...] = ()

    @field_validator("members")
    @classmethod
    def _members(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a person twice: {', '.join(sorted(p for p in set(v) if v.count(p) > 1))}")
        return tuple(sorted(v))

    @field_validator("overflow")
    @classmethod
    def _overflow_set(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a region twice: {', '.join(sorted(r for r in set(v) if v.count(r) > 1))}")
        return tuple(sorted(v))

    @field_validator("vpn_group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        return None if v is None else access_group_id(v)

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
    quotas: QuotaValues = Field(default_factory=dict)  # raised in every region of every account the fleet uses
    # Whether the default VPC AWS creates in every region of a new account has been deleted in the accounts the
    # fleet uses; while it remains it counts against VPCs per Region (`dlinfra check`, docs/limits.md).
    default_vpc_deleted: bool = False
    standard_images: StandardImages | None = None  # images `dlinfra run` runs code in (fleet.images)

    @field_validator("quotas")
    @classmethod
    def _quota_codes(cls, v: QuotaValues) -> QuotaValues:
        return check_codes(v)

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

    # Derived views used by every later layer.
    @property
    def primary_region(self) -> str:
        """The region marked primary."""
        return next(name for name, spec in self.regions.items() if spec.primary)

    def azs(self, region: str) -> tuple[str, ...]:
        """The AZ names this fleet uses in a region (the first N the region offers)."""
        return known_regions()[region].azs[: self.regions[region].azs]

    def zone_id(self, region: str, az: str) -> str:
        """The zone id an AZ name labels (dlinfra/data/regions.yaml): what AWS is given where placement matters."""
        return known_regions()[region].zone_ids[az]

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
            zone_id = pool.capacity_reservations[region].zone_id
            return (known_regions()[region].az_of(zone_id) or zone_id,)  # validation refuses a zone not in region
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
