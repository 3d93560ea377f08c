"""dlinfra's policy rules: plain functions over a resource's type, camelCase inputs and options.

The same functions run in the CrossGuard pack (`pulumi preview --policy-pack policy`, see policy/__main__.py)
and in `dlinfra check` over the offline plan exports. Resource rules return violation messages; stack rules
see every resource of a stack and return (urn, message) pairs. Importing this module has no side effects.

Inputs may be plain dicts and lists (plan exports) or the policy SDK's read-only proxies, which raise when a
value is unknown during preview; so the rules only use the Mapping and Sequence protocols.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from dlinfra.model.fleet.labels import DRAIN_TAINT_KEYS
from dlinfra.model.naming import STANDARD_TAG_KEYS

Level = Literal["mandatory", "advisory"]

# Type tokens the rules look at.
VPC = "aws:ec2/vpc:Vpc"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
EBS_VOLUME = "aws:ebs/volume:Volume"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
FSX_FILE_SYSTEMS = (
    FSX_LUSTRE,
    "aws:fsx/openZfsFileSystem:OpenZfsFileSystem",
    "aws:fsx/ontapFileSystem:OntapFileSystem",
    "aws:fsx/windowsFileSystem:WindowsFileSystem",
)
EKS_CLUSTER = "aws:eks/cluster:Cluster"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"
VPN_CONNECTION = "aws:ec2/vpnConnection:VpnConnection"
CLIENT_VPN_ENDPOINT = "aws:ec2clientvpn/endpoint:Endpoint"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
S3_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
S3_ENCRYPTION_CONFIGS = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
S3_PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
S3_ACCOUNT_PUBLIC_ACCESS_BLOCK = "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock"
S3_ACLS = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
K8S_NAMESPACE = "kubernetes:core/v1:Namespace"
RESOURCE_FLAVOR = "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"
# Where each workload kind keeps its pods' tolerations. DaemonSets are left out on purpose: they run on every node
# and drains skip them (their controller tolerates the cordon itself).
POD_SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
TEAM_LABEL = "dlinfra.io/team"  # components/platform_values.TEAM_LABEL: a team's namespace
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
KUEUE_CUSTOM = "kubernetes:kueue.x-k8s.io/v1beta2:"  # Kueue kinds as typed resources: <this><Kind>
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # components/platform_values.MULTIKUEUE_CONTROLLER

# What a stateful resource holds: losing it to a replacement or deletion loses data. This is the one list:
# the `stateful-protected` rule and `dlinfra diff` (which shouts about their replacement) both read it.
STATEFUL_TYPES: Mapping[str, str] = {
    EFS_FILE_SYSTEM: "EFS file system: home directories and datasets",
    EBS_VOLUME: "EBS volume: its data",
    "aws:s3/bucket:Bucket": "S3 bucket: datasets, checkpoints and results",
    "aws:s3/bucketV2:BucketV2": "S3 bucket: datasets, checkpoints and results",
    **{t: "FSx file system: scratch and linked data" for t in FSX_FILE_SYSTEMS},
    # Deleting a key makes every ciphertext under it (EBS, EFS, S3, logs, EKS secrets) unreadable for good.
    "aws:kms/key:Key": "KMS key: everything encrypted with it",
    # A replaced cluster loses its etcd: every Kubernetes object, queue and quota lives there.
    EKS_CLUSTER: "EKS cluster: every Kubernetes object in its etcd",
    "aws:backup/vault:Vault": "Backup vault: its recovery points",
}

# Protected on purpose though they hold no data: losing one costs more than re-creating it (say, a CA whose
# replacement invalidates every laptop's VPN profile). Each entry gives its reason; `protect-only-stateful` lets them
# be protected. Empty on purpose: everything dlinfra protects today is in STATEFUL_TYPES (grep protect=True in
# components/). Add an entry only with a reason a reviewer can check.
COSTLY_TO_LOSE: Mapping[str, str] = MappingProxyType({})

REQUIRED_TAGS = STANDARD_TAG_KEYS  # project, environment, region, component, managed-by

AUTOSCALER = "k8s.io/cluster-autoscaler"
GPU_TEMPLATE_TAG = f"{AUTOSCALER}/node-template/resources/nvidia.com/gpu"

# IKE and IPsec proposals a site VPN may offer (the AWS names). RFC 8247 says DH groups 22-24 (MODP with
# small subgroups) SHOULD NOT or MUST NOT be used, so "DH >= 14" here means 14-21.
STRONG_CIPHERS = frozenset({"AES256", "AES256-GCM-16"})
STRONG_INTEGRITY = frozenset({"SHA2-256", "SHA2-384", "SHA2-512"})
STRONG_DH_GROUPS = frozenset({14, 15, 16, 17, 18, 19, 20, 21})

S3_SSE_ALGORITHMS = frozenset({"aws:kms", "aws:kms:dsse", "AES256"})
S3_PUBLIC_ACLS = frozenset({"public-read", "public-read-write", "authenticated-read"})
S3_BLOCK_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


@dataclass(frozen=True)
class IngressException:
    """A security-group ingress from anywhere that the design allows, and why."""

    component: str  # `component` tag of the security group (inline rules) or of the rule resource
    protocol: str  # "tcp", "udp", "icmp" or "-1" (all)
    from_port: int
    to_port: int
    reason: str  # why the whole internet must reach this port; reviewed like code


# Empty on purpose: nothing dlinfra declares must be reachable from the internet through a security group.
# The Client VPN endpoint in particular needs no such rule: AWS terminates the laptops' OpenVPN sessions
# (443/udp) on its managed endpoint before any security group applies, and the endpoint's security group
# only governs traffic from the endpoint's interfaces into the VPC. Opening 443/udp to the world there
# would only widen what reaches those interfaces. Add an entry only with a reason a reviewer can check.
INGRESS_ALLOWLIST: tuple[IngressException, ...] = ()


@dataclass(frozen=True)
class Resource:
    """One resource as the rules see it."""

    urn: str
    type: str
    name: str
    inputs: Mapping[str, Any]  # camelCase, as the provider sees them
    protect: bool = False
    dependencies: tuple[str, ...] = ()  # URNs of the resources this one depends on
    id: str = ""  # known in offline plans; empty during a real preview of a new resource
    provider_urn: str = ""  # URN of the provider the resource goes through; empty when unknown
    provider_inputs: Mapping[str, Any] = field(default_factory=dict)  # that provider's inputs (region, ...)

    @property
    def stack(self) -> str:
        """The stack in the URN (`urn:pulumi:<stack>::<project>::<type>::<name>`)."""
        return self.urn.removeprefix("urn:pulumi:").split("::", 1)[0]


class Violation(NamedTuple):
    """A stack rule's finding: which resource, and what is wrong."""

    urn: str
    message: str


@dataclass(frozen=True)
class AddressPlan:
    """The committed address plan, as the VPC rule needs it."""

    vpcs: Mapping[str, ipaddress.IPv4Network]  # stack name -> its planned VPC block
    vpc_keys: Mapping[str, str]  # stack name -> the VPC's allocation key (vpc/<env>/<region>)
    blocks: Mapping[str, ipaddress.IPv4Network]  # every top-level allocation key -> block (VPCs, LANs, pools)
    source: str = "cidr-lock.yaml"


@dataclass(frozen=True)
class Context:
    """What rules need beyond the resources: facts from the provider SDK, instance table and address plan."""

    taggable: Callable[[str], bool]  # does a type token accept `tags`? (read from the provider SDK)
    gpu_count: Callable[[str], int | None]  # NVIDIA GPUs of an instance type; None when the type is unknown
    address_plan: AddressPlan | None = None
    address_plan_error: str = ""  # why the plan could not be loaded: reported as a violation, never ignored
    ingress_allowlist: tuple[IngressException, ...] = INGRESS_ALLOWLIST
    # type -> why it is protected though it holds no data
    costly_to_lose: Mapping[str, str] = field(default_factory=lambda: COSTLY_TO_LOSE)
    today: datetime.date | None = None  # the date version-support checks use; None: dlinfra.eks.today()


ResourceCheck = Callable[[Resource, Context], list[str]]
StackCheck = Callable[[Sequence[Resource], Context], list[Violation]]


@dataclass(frozen=True)
class ResourceRule:
    """A rule over one resource at a time (a CrossGuard ResourceValidationPolicy)."""

    name: str
    description: str
    level: Level
    check: ResourceCheck


@dataclass(frozen=True)
class StackRule:
    """A rule over every resource of a stack (a CrossGuard StackValidationPolicy)."""

    name: str
    description: str
    level: Level
    check: StackCheck


# --- value helpers -------------------------------------------------------------------------------------


def _items(value: Any) -> list[Any]:
    """A list value as a list; None as empty; a scalar as a one-item list."""
    if value is None:
        return []
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return [value]


def _objects(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a list value (or the value itself when it is one object)."""
    if isinstance(value, Mapping):
        return [value]
    return [v for v in _items(value) if isinstance(v, Mapping)]


def _object(value: Any) -> Mapping[str, Any]:
    """A nested object, or an empty one (Terraform-style single-item lists are accepted too)."""
    objects = _objects(value)
    return objects[0] if objects else {}


def _true(value: Any) -> bool:
    """True for a boolean true or the string "true" (some AWS inputs, like launch template ebs, are strings)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _int(value: Any) -> int | None:
    """An integer from an int, an integral float (the engine sends numbers as floats) or a digit string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _has(mapping: Mapping[str, Any], key: str) -> bool:
    """True when an input is set, without reading its value (a key ARN is unknown until the key exists)."""
    # Iterating keys never touches values; `in` on the policy SDK's proxy would read (and raise on) the value.
    return any(k == key for k in mapping)


def tags_of(resource: Resource) -> dict[str, str]:
    """A resource's tags: a map for most types, a list of {key, value} for Auto Scaling groups."""
    raw = resource.inputs.get("tags")
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items() if v is not None}
    return {str(t.get("key")): str(t.get("value")) for t in _objects(raw) if t.get("key") is not None}


def _refers_to(child: Resource, parent: Resource, key: str) -> bool:
    """True when `child` points at `parent` through input `key` (by dependency, id or physical name)."""
    if parent.urn in child.dependencies:
        return True
    target = child.inputs.get(key)
    names = {parent.id, parent.inputs.get("bucket"), parent.inputs.get("name")} - {None, ""}
    return isinstance(target, str) and target in names


# --- encryption at rest ---------------------------------------------------------------------------------


def ebs_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EBS volumes, launch template block devices and instance volumes are encrypted."""
    inputs = resource.inputs
    if resource.type == EBS_VOLUME:
        return [] if _true(inputs.get("encrypted")) else ["EBS volume is not encrypted: set encrypted=true"]
    out: list[str] = []
    if resource.type == LAUNCH_TEMPLATE:
        ebs_devices = 0
        for i, mapping in enumerate(_objects(inputs.get("blockDeviceMappings"))):
            ebs = mapping.get("ebs")
            if not isinstance(ebs, Mapping):
                continue  # instance store or a suppressed device: nothing at rest on EBS
            ebs_devices += 1
            if not _true(ebs.get("encrypted")):
                device = mapping.get("deviceName") or "?"
                out.append(f'blockDeviceMappings[{i}] ({device}) is not encrypted: set ebs.encrypted="true"')
        if ebs_devices == 0:
            out.append(
                "declares no EBS block device, so the root volume is only as encrypted as the AMI's snapshot: "
                'map the root device with ebs.encrypted="true"'
            )
    elif resource.type == INSTANCE:
        root = _object(inputs.get("rootBlockDevice"))
        if not _true(root.get("encrypted")):
            out.append("rootBlockDevice is not encrypted: set rootBlockDevice.encrypted=true")
        for i, device in enumerate(_objects(inputs.get("ebsBlockDevices"))):
            if not _true(device.get("encrypted")):
                out.append(f"ebsBlockDevices[{i}] ({device.get('deviceName') or '?'}) is not encrypted")
    return out


def efs_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EFS file systems are encrypted at rest (encryption cannot be turned on after creation)."""
    if resource.type != EFS_FILE_SYSTEM or _true(resource.inputs.get("encrypted")):
        return []
    return ["EFS file system is not encrypted at rest: set encrypted=true (it forces a replacement later)"]


def fsx_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """FSx file systems use a customer-managed KMS key wherever the service takes one."""
    if resource.type not in FSX_FILE_SYSTEMS:
        return []
    if resource.type == FSX_LUSTRE:
        deployment = str(resource.inputs.get("deploymentType") or "SCRATCH_1")
        if deployment.startswith("SCRATCH"):
            return []  # scratch file systems are always encrypted with FSx's own key and take no other
    if _has(resource.inputs, "kmsKeyId"):
        return []
    return ["FSx file system has no kmsKeyId: encrypt it with a customer-managed KMS key"]


def eks_secrets_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EKS clusters envelope-encrypt Kubernetes secrets with a KMS key."""
    if resource.type != EKS_CLUSTER:
        return []
    config = _object(resource.inputs.get("encryptionConfig"))
    if "secrets" not in [str(r) for r in _items(config.get("resources"))]:
        return ['encryptionConfig does not cover "secrets": set encryptionConfig.resources=["secrets"]']
    if not _has(_object(config.get("provider")), "keyArn"):
        return ["encryptionConfig.provider.keyArn is not set: name the KMS key that encrypts secrets"]
    return []


def _sse_problems(rules: Any) -> list[str]:
    """What is wrong with the `rule` list of an S3 server-side encryption configuration."""
    algorithms = [
        _object(rule.get("applyServerSideEncryptionByDefault")).get("sseAlgorithm") for rule in _objects(rules)
    ]
    if not algorithms:
        return ["server-side encryption configuration has no rule: add applyServerSideEncryptionByDefault"]
    bad = [a for a in algorithms if a not in S3_SSE_ALGORITHMS]
    if bad:
        return [f"sseAlgorithm {bad[0]!r} is not one of {', '.join(sorted(S3_SSE_ALGORITHMS))}"]
    return []


def s3_encrypted(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every S3 bucket has a server-side encryption configuration with a real algorithm."""
    configs = [r for r in resources if r.type in S3_ENCRYPTION_CONFIGS]
    # pulumi-aws names the rule list `rules` (Terraform: `rule`); accept either spelling.
    out = [Violation(c.urn, msg) for c in configs for msg in _sse_problems(c.inputs.get("rules", c.inputs.get("rule")))]
    for bucket in (r for r in resources if r.type in S3_BUCKETS):
        inline = _objects(bucket.inputs.get("serverSideEncryptionConfiguration")) + _objects(
            bucket.inputs.get("serverSideEncryptionConfigurations")
        )
        if inline:
            out += [
                Violation(bucket.urn, msg) for c in inline for msg in _sse_problems(c.get("rule") or c.get("rules"))
            ]
        elif not any(_refers_to(c, bucket, "bucket") for c in configs):
            out.append(
                Violation(
                    bucket.urn,
                    "S3 bucket has no server-side encryption configuration: declare a "
                    "BucketServerSideEncryptionConfiguration for it",
                )
            )
    return out


# --- public exposure ------------------------------------------------------------------------------------


def s3_no_public_access(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every S3 bucket has a public access block with all four settings true, and no public ACL."""
    blocks = [r for r in resources if r.type in (S3_PUBLIC_ACCESS_BLOCK, S3_ACCOUNT_PUBLIC_ACCESS_BLOCK)]
    out: list[Violation] = []
    complete: list[Resource] = []
    for block in blocks:
        off = [flag for flag in S3_BLOCK_FLAGS if not _true(block.inputs.get(flag))]
        if off:
            out.append(Violation(block.urn, f"public access block leaves {', '.join(off)} off: set all four to true"))
        else:
            complete.append(block)
    account_wide = any(b.type == S3_ACCOUNT_PUBLIC_ACCESS_BLOCK for b in complete)
    for bucket in (r for r in resources if r.type in S3_BUCKETS):
        if str(bucket.inputs.get("acl") or "") in S3_PUBLIC_ACLS:
            out.append(Violation(bucket.urn, f"S3 bucket has the public ACL {bucket.inputs.get('acl')!r}"))
        if account_wide or any(_refers_to(b, bucket, "bucket") for b in complete if b.type == S3_PUBLIC_ACCESS_BLOCK):
            continue
        out.append(
            Violation(bucket.urn, "S3 bucket has no public access block with all four settings true: declare one")
        )
    for acl in (r for r in resources if r.type in S3_ACLS):
        if str(acl.inputs.get("acl") or "") in S3_PUBLIC_ACLS:
            out.append(Violation(acl.urn, f"bucket ACL {acl.inputs.get('acl')!r} makes the bucket public"))
    return out


def imdsv2_required(resource: Resource, ctx: Context) -> list[str]:
    """Launch templates and instances require IMDSv2 session tokens (or turn the metadata service off)."""
    if resource.type not in (LAUNCH_TEMPLATE, INSTANCE):
        return []
    options = _object(resource.inputs.get("metadataOptions"))
    if options.get("httpEndpoint") == "disabled":
        return []
    tokens = options.get("httpTokens")
    if tokens == "required":
        return []
    state = "unset, so IMDSv1 stays on" if tokens is None else f"{tokens!r}"
    return [f'metadataOptions.httpTokens is {state}: set httpTokens="required" (IMDSv2 only)']


def _is_world(cidr: Any) -> bool:
    """True for a block that is (nearly) the whole internet: /0, or a public block of /8 or wider."""
    try:
        net = ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return False
    # 0.0.0.0/1 + 128.0.0.0/1 is as open as 0.0.0.0/0; a wide private block (10.0.0.0/8) is not.
    limit = 8 if net.version == 4 else 16
    return net.prefixlen == 0 or (net.prefixlen <= limit and not net.is_private)


_PROTOCOLS = {"6": "tcp", "17": "udp", "1": "icmp", "all": "-1"}


def _allowed(ctx: Context, component: str | None, protocol: Any, from_port: Any, to_port: Any) -> bool:
    proto = _PROTOCOLS.get(str(protocol).lower(), str(protocol).lower())
    return any(
        e.component == component
        and e.protocol == proto
        and e.from_port == _int(from_port)
        and e.to_port == _int(to_port)
        for e in ctx.ingress_allowlist
    )


def _ports(protocol: Any, from_port: Any, to_port: Any) -> str:
    proto = _PROTOCOLS.get(str(protocol).lower(), str(protocol).lower())
    if proto == "-1":
        return "all traffic"
    low, high = _int(from_port), _int(to_port)
    return f"{proto}/{low}" if low == high else f"{proto}/{low}-{high}"


def no_world_ingress(resource: Resource, ctx: Context) -> list[str]:
    """No security-group ingress from 0.0.0.0/0 or ::/0, except what INGRESS_ALLOWLIST declares."""
    inputs = resource.inputs
    component = tags_of(resource).get("component")
    found: list[tuple[str, Any, Any, Any, str]] = []  # (where, protocol, from, to, cidr)
    if resource.type == SECURITY_GROUP:
        for i, rule in enumerate(_objects(inputs.get("ingress"))):
            for cidr in _items(rule.get("cidrBlocks")) + _items(rule.get("ipv6CidrBlocks")):
                found.append((f"ingress[{i}]", rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidr))
    elif resource.type == SECURITY_GROUP_INGRESS_RULE:
        for key in ("cidrIpv4", "cidrIpv6"):
            if inputs.get(key) is not None:
                found.append((key, inputs.get("ipProtocol"), inputs.get("fromPort"), inputs.get("toPort"), inputs[key]))
    elif resource.type == SECURITY_GROUP_RULE and inputs.get("type") == "ingress":
        component = None  # this type carries no tags, so no allowlist entry can name it
        for cidr in _items(inputs.get("cidrBlocks")) + _items(inputs.get("ipv6CidrBlocks")):
            found.append(("cidrBlocks", inputs.get("protocol"), inputs.get("fromPort"), inputs.get("toPort"), cidr))
    return [
        f"{where} allows {_ports(proto, low, high)} from {cidr}: restrict the source, or add an IngressException "
        "with a reason to INGRESS_ALLOWLIST"
        for where, proto, low, high, cidr in found
        if _is_world(cidr) and not _allowed(ctx, component, proto, low, high)
    ]


# --- address plan ----------------------------------------------------------------------------------------


def _vpc_cidr(vpc: Resource) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(vpc.inputs.get("cidrBlock")))
    except ValueError:
        return None


def vpcs_disjoint(resources: Sequence[Resource], *, across_stacks_only: bool = False) -> list[Violation]:
    """No two VPCs among `resources` overlap (one stack's resources, or every stack's)."""
    out: list[Violation] = []
    seen: list[tuple[Resource, ipaddress.IPv4Network | ipaddress.IPv6Network]] = []
    for vpc in (r for r in resources if r.type == VPC):
        cidr = _vpc_cidr(vpc)
        if cidr is None:
            continue
        for other, other_cidr in seen:
            if cidr.overlaps(other_cidr) and not (across_stacks_only and other.stack == vpc.stack):
                out.append(
                    Violation(vpc.urn, f"cidrBlock {cidr} overlaps VPC {other.name} ({other_cidr}) of {other.stack}")
                )
        seen.append((vpc, cidr))
    return out


def vpc_cidrs_planned(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every VPC has exactly its planned block, which overlaps no other planned block and no other VPC."""
    vpcs = [r for r in resources if r.type == VPC]
    if not vpcs:
        return []
    plan = ctx.address_plan
    if plan is None:
        why = ctx.address_plan_error or "no address plan was given"
        return [Violation(v.urn, f"cannot check the VPC's CIDR against the address plan: {why}") for v in vpcs]
    out: list[Violation] = []
    for vpc in vpcs:
        raw = vpc.inputs.get("cidrBlock")
        planned, key = plan.vpcs.get(vpc.stack), plan.vpc_keys.get(vpc.stack, "?")
        cidr = _vpc_cidr(vpc)
        if planned is None:
            out.append(Violation(vpc.urn, f"stack {vpc.stack} has no VPC in the address plan ({plan.source})"))
        elif cidr is None:
            out.append(Violation(vpc.urn, f"cidrBlock {raw!r} is not a CIDR; the plan has {planned} ({key})"))
        elif cidr != planned:
            out.append(
                Violation(vpc.urn, f"cidrBlock {cidr} is not the planned block {planned} ({plan.source}: {key})")
            )
        if cidr is None:
            continue
        for other_key, block in plan.blocks.items():
            if other_key != key and cidr.overlaps(block):
                out.append(Violation(vpc.urn, f"cidrBlock {cidr} overlaps {other_key} ({block}) in {plan.source}"))
    return out + vpcs_disjoint(vpcs)


# --- safety of state, tags, autoscaling, VPN ---------------------------------------------------------------


def stateful_protected(resource: Resource, ctx: Context) -> list[str]:
    """Stateful resources (STATEFUL_TYPES) are protected against deletion and replacement."""
    what = STATEFUL_TYPES.get(resource.type)
    if what is None or resource.protect:
        return []
    return [f"{what} would be lost on delete or replace: declare it with ResourceOptions(protect=True)"]


def protect_only_stateful(resource: Resource, ctx: Context) -> list[str]:
    """Only what holds data is protected: a protected resource can never be deleted by an apply, so protecting
    access entries, add-ons or policies (as a child inheriting its parent's `protect` does) makes removing a
    team, an admin or a site impossible to apply. Source: Pulumi docs, resource option `protect` (children
    inherit it from their parent)."""
    if not resource.protect or resource.type in STATEFUL_TYPES or resource.type in ctx.costly_to_lose:
        return []
    return [
        f"{resource.type} is protected but holds no data (not in STATEFUL_TYPES): it could never be removed; "
        "set protect=False explicitly if it inherits protect from a stateful parent, or list the type with a "
        "reason in COSTLY_TO_LOSE if losing it costs that much"
    ]


def required_tags(resource: Resource, ctx: Context) -> list[str]:
    """Taggable AWS resources carry project, environment, region, component and managed-by."""
    if not resource.type.startswith("aws:") or not ctx.taggable(resource.type):
        return []
    tags = tags_of(resource)
    missing = [key for key in REQUIRED_TAGS if not tags.get(key)]
    if not missing:
        return []
    return [f"missing required tags: {', '.join(missing)} (set tags from Names.tags(...))"]


def _group_instance_types(group: Resource, templates: Sequence[Resource]) -> list[str]:
    """Instance types an Auto Scaling group may launch: its overrides, else its launch template's type."""
    policy = _object(group.inputs.get("mixedInstancesPolicy"))
    spec = _object(policy.get("launchTemplate"))
    types = [str(o["instanceType"]) for o in _objects(spec.get("overrides")) if o.get("instanceType")]
    if types:
        return types
    # By dependency first: during a real preview a new template's id is unknown, and reading it would raise.
    used = [t for t in templates if t.urn in group.dependencies]
    if not used:
        ids = {
            _object(group.inputs.get("launchTemplate")).get("id"),
            _object(spec.get("launchTemplateSpecification")).get("launchTemplateId"),
        } - {None, ""}
        used = [t for t in templates if t.id and t.id in ids]
    return [str(t.inputs["instanceType"]) for t in used if t.inputs.get("instanceType")]


def gpu_pools_scale_from_zero(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU Auto Scaling groups carry cluster-autoscaler's discovery tags and a correct GPU node template."""
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    out: list[Violation] = []
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        tags = tags_of(group)
        types = _group_instance_types(group, templates)
        counts = {t: ctx.gpu_count(t) for t in types}
        if GPU_TEMPLATE_TAG not in tags and not any(counts.values()):
            continue  # not a GPU pool
        problems: list[str] = []
        if tags.get(f"{AUTOSCALER}/enabled") != "true":
            problems.append(f'tag {AUTOSCALER}/enabled="true" is missing: the autoscaler will not discover the pool')
        if not any(k.startswith(f"{AUTOSCALER}/") and v == "owned" for k, v in tags.items()):
            problems.append(f'no {AUTOSCALER}/<cluster>="owned" tag: the autoscaler will not discover the pool')
        declared = _int(tags.get(GPU_TEMPLATE_TAG))
        known = {c for c in counts.values() if c}
        if declared is None or declared <= 0:
            problems.append(
                f"tag {GPU_TEMPLATE_TAG} must give the GPUs per node: without it the autoscaler cannot "
                "scale the pool up from zero for GPU pods"
            )
        elif len(known) > 1:
            problems.append(f"instance types with different GPU counts ({counts}) cannot share one node template")
        elif known and declared not in known:
            problems.append(f"tag {GPU_TEMPLATE_TAG}={declared} but {', '.join(types)} has {known.pop()} GPUs")
        out += [Violation(group.urn, p) for p in problems]
    return out


def _is_gpu_group(group: Resource, templates: Sequence[Resource], ctx: Context) -> bool:
    """True when the group launches GPU instance types, or declares GPUs in its scale-from-zero template."""
    if GPU_TEMPLATE_TAG in tags_of(group):
        return True
    return any(ctx.gpu_count(t) for t in _group_instance_types(group, templates))


def gpu_pools_no_auto_refresh(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU Auto Scaling groups never replace running instances by themselves (that drains training jobs).

    Sources: pulumi-aws autoscaling.Group `instance_refresh` ("A refresh is started when any of ...
    launch_template, mixed_instances_policy change", so a new AMI or user data starts one); AWS EC2 Auto
    Scaling user guide, "Replace Auto Scaling instances based on maximum instance lifetime" and "Suspend and
    resume Amazon EC2 Auto Scaling processes" (AZRebalance terminates instances to even out AZs). GPU pools
    are rolled on purpose with `dlinfra pool roll`.
    """
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    out: list[Violation] = []
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        if not _is_gpu_group(group, templates, ctx):
            continue
        inputs = group.inputs
        if _object(inputs.get("instanceRefresh")):
            out.append(
                Violation(
                    group.urn,
                    "instanceRefresh is set: every new launch template version (AMI, user data) would terminate "
                    "running GPU nodes; remove it and roll the pool with `dlinfra pool roll`",
                )
            )
        lifetime = _int(inputs.get("maxInstanceLifetime"))
        if lifetime:
            out.append(
                Violation(
                    group.urn,
                    f"maxInstanceLifetime={lifetime}s replaces GPU nodes when they reach that age, jobs or not: "
                    "leave it unset",
                )
            )
        if "AZRebalance" not in [str(p) for p in _items(inputs.get("suspendedProcesses"))]:
            out.append(
                Violation(
                    group.urn,
                    "AZRebalance is not suspended: Auto Scaling terminates GPU nodes to even out AZs; add it to "
                    "suspendedProcesses",
                )
            )
    return out


def team_namespaces_pod_security(resource: Resource, ctx: Context) -> list[str]:
    """Team namespaces enforce the baseline or restricted Pod Security Standard, never privileged.

    Source: Kubernetes "Pod Security Admission" (the pod-security.kubernetes.io/enforce label; unset means
    privileged) and "Pod Security Standards" (baseline forbids privileged containers, host namespaces, hostPath
    and added capabilities). Training pods that use EFA need none of those (tests/fixtures/k8s/efa-training-pod.yaml).
    """
    if resource.type != K8S_NAMESPACE:
        return []
    labels = _object(_object(resource.inputs.get("metadata")).get("labels"))
    if TEAM_LABEL not in [str(k) for k in labels]:
        return []
    level = labels.get(PSA_ENFORCE)
    if level in ("baseline", "restricted"):
        return []
    state = "unset, which admits privileged pods" if level is None else f"{level!r}"
    return [f'{PSA_ENFORCE} is {state}: team namespaces enforce "baseline" (or "restricted")']


def _kueue_named(resources: Sequence[Resource], kind: str) -> dict[str, Resource]:
    return {
        str(_object(r.inputs.get("metadata")).get("name")): r for r in resources if r.type == f"{KUEUE_CUSTOM}{kind}"
    }


def multikueue_wired(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """MultiKueue objects are wired so Kueue activates them.

    - A ClusterQueue may not limit a MultiKueue AdmissionCheck to some flavors: Kueue marks such a queue inactive
      ("Cannot specify MultiKueue AdmissionCheck per flavor", kueue v0.19 pkg/cache/scheduler/clusterqueue.go).
    - A MultiKueue AdmissionCheck names a MultiKueueConfig of the stack, whose clusters are MultiKueueClusters of
      the stack (Kueue docs, "Setup a MultiKueue environment": otherwise the check stays inactive).
    - A worker's kubeconfig comes from a Secret: `locationType: Path` needs an alpha feature gate and a file
      mounted into the controller (same guide, "Enable locationType=Path").
    """
    checks = _kueue_named(resources, "AdmissionCheck")
    configs = _kueue_named(resources, "MultiKueueConfig")
    clusters = _kueue_named(resources, "MultiKueueCluster")
    multikueue = {
        n for n, r in checks.items() if _object(r.inputs.get("spec")).get("controllerName") == MULTIKUEUE_CONTROLLER
    }
    out = []
    for name, queue in _kueue_named(resources, "ClusterQueue").items():
        strategy = _object(_object(queue.inputs.get("spec")).get("admissionChecksStrategy"))
        for rule in _objects(strategy.get("admissionChecks")):
            if str(rule.get("name")) in multikueue and _items(rule.get("onFlavors")):
                out.append(
                    Violation(
                        queue.urn,
                        f"ClusterQueue {name}: MultiKueue check {rule.get('name')} is limited to "
                        "some flavors; Kueue deactivates the queue (it must apply to every flavor)",
                    )
                )
    for name in sorted(multikueue):
        params = _object(_object(checks[name].inputs.get("spec")).get("parameters"))
        config = configs.get(str(params.get("name")))
        if params.get("kind") != "MultiKueueConfig" or config is None:
            out.append(
                Violation(checks[name].urn, f"AdmissionCheck {name}: no MultiKueueConfig {params.get('name')!r}")
            )
            continue
        missing = [str(c) for c in _items(_object(config.inputs.get("spec")).get("clusters")) if str(c) not in clusters]
        if missing:
            out.append(
                Violation(
                    config.urn, f"MultiKueueConfig {params.get('name')}: no MultiKueueCluster {', '.join(missing)}"
                )
            )
    for name, cluster in clusters.items():
        source = _object(_object(_object(cluster.inputs.get("spec")).get("clusterSource")).get("kubeConfig"))
        if source.get("locationType", "Secret") != "Secret":
            out.append(
                Violation(
                    cluster.urn, f"MultiKueueCluster {name}: kubeconfig from {source.get('locationType')}, not a Secret"
                )
            )
    return out


def tolerates(toleration: Mapping[str, Any], key: str, effect: str = "NoSchedule") -> bool:
    """Does this toleration let a pod onto a node with taint `key` (any value) and `effect`?

    Source: Kubernetes "Taints and Tolerations": an empty key with operator Exists matches every taint, an empty
    effect every effect; operator Equal (the default) also needs the value, which the handler's taints vary.
    """
    if toleration.get("effect") not in (None, "", effect):
        return False
    if toleration.get("key") in (None, ""):
        return toleration.get("operator") == "Exists"
    return bool(toleration.get("key") == key)


def _drain_taints_tolerated(tolerations: Any) -> list[str]:
    return sorted({key for t in _objects(tolerations) for key in DRAIN_TAINT_KEYS if tolerates(t, key)})


def drain_taints_not_tolerated(resource: Resource, ctx: Context) -> list[str]:
    """Work never tolerates the taints that keep it off a node about to go (maintenance, interruption, cordon).

    Sources: aws-node-termination-handler v1.25.6 pkg/node/node.go (the taints it puts before draining);
    Kueue v1beta2 ResourceFlavor: `tolerations` "will be added to the pods admitted" in the flavor, and
    workloads "must have tolerations for these nodeTaints" to be admitted to it (apis/kueue/v1beta2).
    """
    if resource.type == RESOURCE_FLAVOR:
        spec = _object(resource.inputs.get("spec"))
        out = [
            f"spec.tolerations tolerate {key}: Kueue adds them to every admitted pod, which would then start on "
            "nodes about to go into maintenance or be drained"
            for key in _drain_taints_tolerated(spec.get("tolerations"))
        ]
        out += [
            f"spec.nodeTaints lists {t.get('key')}: every job admitted to this flavor would have to tolerate it"
            for t in _objects(spec.get("nodeTaints"))
            if t.get("key") in DRAIN_TAINT_KEYS
        ]
        return out
    path = POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return []
    pod_spec: Mapping[str, Any] = resource.inputs
    for part in path:
        pod_spec = _object(pod_spec.get(part))
    return [
        f"the pod template tolerates {key}: its pods would start on nodes about to go into maintenance or be drained"
        for key in _drain_taints_tolerated(pod_spec.get("tolerations"))
    ]


def _algorithms(values: Iterable[Any]) -> list[str | int]:
    return [n if (n := _int(v)) is not None else str(v) for v in values]


def vpn_strong_crypto(resource: Resource, ctx: Context) -> list[str]:
    """Site-to-site VPN tunnels are IKEv2 only and offer only strong proposals in both phases."""
    if resource.type != VPN_CONNECTION:
        return []
    out: list[str] = []
    allowed: tuple[tuple[str, frozenset[Any]], ...] = (
        ("EncryptionAlgorithms", STRONG_CIPHERS),
        ("IntegrityAlgorithms", STRONG_INTEGRITY),
        ("DhGroupNumbers", STRONG_DH_GROUPS),
    )
    for tunnel in ("tunnel1", "tunnel2"):
        versions = [str(v) for v in _items(resource.inputs.get(f"{tunnel}IkeVersions"))]
        if versions != ["ikev2"]:
            state = versions if versions else "unset (AWS then accepts ikev1 too)"
            out.append(f'{tunnel}IkeVersions is {state}: set ["ikev2"]')
        for phase in ("Phase1", "Phase2"):
            for what, strong in allowed:
                key = f"{tunnel}{phase}{what}"
                values = _algorithms(_items(resource.inputs.get(key)))
                if not values:
                    out.append(f"{key} is unset, so AWS offers its defaults, weak ones included: list the strong ones")
                elif weak := [v for v in values if v not in strong]:
                    out.append(f"{key} allows {weak}: offer only {', '.join(str(s) for s in sorted(strong))}")
    return out


# --- advisories --------------------------------------------------------------------------------------------


def vpc_flow_logs(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every VPC has a flow log (investigating a network incident without one is guesswork)."""
    logs = [r for r in resources if r.type == FLOW_LOG]
    return [
        Violation(vpc.urn, "VPC has no flow log")
        for vpc in resources
        if vpc.type == VPC and not any(_refers_to(log, vpc, "vpcId") for log in logs)
    ]


def client_vpn_connection_logs(resource: Resource, ctx: Context) -> list[str]:
    """Client VPN endpoints log connections (who connected, from where, when)."""
    if resource.type != CLIENT_VPN_ENDPOINT:
        return []
    if _true(_object(resource.inputs.get("connectionLogOptions")).get("enabled")):
        return []
    return ["connectionLogOptions.enabled is not true: laptop connections go unrecorded"]


# Packages whose resources must name their provider: Pulumi.yaml disables their default providers, and a
# default provider takes the region or cluster of whoever runs `pulumi up`.
EXPLICIT_PROVIDER_PACKAGES = frozenset({"aws", "kubernetes"})
# A stack named after a region (`<env>-<region>`, `<env>-<region>-k8s`): its AWS resources belong in that region.
_STACK_REGION = re.compile(r"^[a-z0-9]+-(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)(?:-k8s)?$")


def explicit_provider(resource: Resource, ctx: Context) -> list[str]:
    """AWS and Kubernetes resources go through an explicit provider, and a regional stack's AWS provider is in the
    stack name's region.

    Pulumi creates a default provider for a resource that names none, configured from the environment of the
    person or runner applying (AWS_REGION, the profile, the current kubeconfig context): a stack applied from the
    wrong shell would then create protected keys and IAM in another region, or objects in another cluster.
    Source: Pulumi docs, "Providers" (default providers, disabling default providers).
    """
    package = resource.type.split(":", 1)[0]
    if package not in EXPLICIT_PROVIDER_PACKAGES:
        return []
    provider_name = resource.provider_urn.rsplit("::", 1)[-1] if resource.provider_urn else ""
    if not provider_name or provider_name.startswith("default"):
        return [f"uses the default {package} provider: pass the stack's explicit provider"]
    match = _STACK_REGION.match(resource.stack)
    region = resource.provider_inputs.get("region")
    if package == "aws" and match and region != match.group("region"):
        return [f"provider region is {region!r}, but the stack {resource.stack} is in {match.group('region')}"]
    return []


def sg_no_inline_rules(resource: Resource, ctx: Context) -> list[str]:
    """Security groups declare no inline rules: every rule is its own resource.

    Inline `ingress`/`egress` blocks and separate rule resources on one group fight each other: perpetual
    diffs, and an apply that revokes the other's rules. Source: pulumi-aws `ec2.SecurityGroup` docs, "NOTE on
    Security Groups and Security Group Rules" (use `vpc.SecurityGroupIngressRule`/`EgressRule`).
    """
    if resource.type != SECURITY_GROUP:
        return []
    inline = [key for key in ("ingress", "egress") if _items(resource.inputs.get(key))]
    return [f"inline {key} rules: declare them as separate rule resources" for key in inline]


def nodes_cluster_owned(resource: Resource, ctx: Context) -> list[str]:
    """Node groups tag their instances `kubernetes.io/cluster/<cluster>=owned`, propagated at launch.

    Self-managed nodes without it are not recognised as the cluster's by the AWS cloud provider and the load
    balancer controller. Source: Amazon EKS user guide, "Create self-managed Amazon Linux nodes" (the
    CloudFormation template's ASG tag); cluster-autoscaler AWS docs (auto-discovery tags).
    """
    if resource.type != AUTOSCALING_GROUP:
        return []
    tags = {str(t.get("key")): t for t in _objects(resource.inputs.get("tags"))}
    clusters = [
        key.removeprefix(f"{AUTOSCALER}/")
        for key, tag in tags.items()
        if key.startswith(f"{AUTOSCALER}/") and key != f"{AUTOSCALER}/enabled" and tag.get("value") == "owned"
    ]
    out = []
    for cluster in clusters:
        tag = tags.get(f"kubernetes.io/cluster/{cluster}")
        if tag is None or tag.get("value") != "owned" or not _true(tag.get("propagateAtLaunch")):
            out.append(f"nodes of cluster {cluster} lack kubernetes.io/cluster/{cluster}=owned propagated at launch")
    return out


S3_LOGGING = ("aws:s3/bucketLogging:BucketLogging", "aws:s3/bucketLoggingV2:BucketLoggingV2")
S3_POLICY = "aws:s3/bucketPolicy:BucketPolicy"


def s3_access_logs_delivered(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A bucket that receives server access logs admits the S3 logging service, scoped to the source account,
    and is not SSE-KMS encrypted (log delivery cannot use a customer key). Without the policy statement the logs
    are silently never delivered. Source: S3 user guide, "Enabling Amazon S3 server access logging" (permissions
    for log delivery, with aws:SourceArn and aws:SourceAccount; SSE-S3 for the destination bucket).
    """
    buckets = [r for r in resources if r.type in S3_BUCKETS]
    policies = [r for r in resources if r.type == S3_POLICY]
    configs = [r for r in resources if r.type in S3_ENCRYPTION_CONFIGS]
    out = []

    def names(child: Resource, key: str, bucket: Resource) -> bool:
        # By value only: a logging configuration also depends on its source bucket.
        return child.inputs.get(key) in {bucket.id, bucket.inputs.get("bucket")} - {None, ""}

    for logging in (r for r in resources if r.type in S3_LOGGING):
        target = next((b for b in buckets if names(logging, "targetBucket", b)), None)
        if target is None:
            continue  # a bucket of another stack or account: not ours to check here
        statements = [
            s
            for p in policies
            if names(p, "bucket", target)
            for s in _objects(_json_or_object(p.inputs.get("policy")).get("Statement"))
        ]
        admitted = [
            s
            for s in statements
            if s.get("Effect") == "Allow"
            and "logging.s3.amazonaws.com" in _items(_object(s.get("Principal")).get("Service"))
            and any("aws:SourceAccount" in _object(block) for block in _object(s.get("Condition")).values())
        ]
        if not admitted:
            out.append(
                Violation(
                    logging.urn,
                    "the log bucket's policy does not admit logging.s3.amazonaws.com with aws:SourceAccount: "
                    "no access log will be delivered",
                )
            )
        for config in configs:
            rules = _objects(config.inputs.get("rules", config.inputs.get("rule")))
            algorithms = {_object(r.get("applyServerSideEncryptionByDefault")).get("sseAlgorithm") for r in rules}
            if names(config, "bucket", target) and algorithms & {"aws:kms", "aws:kms:dsse"}:
                out.append(Violation(logging.urn, "the log bucket uses SSE-KMS: server access logs need SSE-S3"))
    return out


def _json_or_object(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return _object(value)


def _eks_lifecycle(resource: Resource, ctx: Context) -> tuple[str, Any] | None:
    """(upgradePolicy.supportType, eks.Lifecycle of the version under it) of an EKS cluster; None for other types.

    The Lifecycle is None when the support type is not set: there is no support end to measure against then.
    """
    from dlinfra.model import eks  # the support dates are data of the planning core

    if resource.type != EKS_CLUSTER:
        return None
    support = str(_object(resource.inputs.get("upgradePolicy")).get("supportType") or "")
    if support not in ("STANDARD", "EXTENDED"):
        return support, None
    policy: eks.UpgradePolicy = "standard" if support == "STANDARD" else "extended"
    return support, eks.lifecycle(str(resource.inputs.get("version")), policy, ctx.today or eks.today())


def eks_version_supported(resource: Resource, ctx: Context) -> list[str]:
    """EKS clusters name their upgrade policy and run a version still inside the support that policy pays for.

    Past its end, EKS upgrades the cluster itself and the stack would try to downgrade it. Source: Amazon EKS user
    guide, "Understand the Kubernetes version lifecycle on EKS" (dates in dlinfra/data/eks.yaml).
    """
    found = _eks_lifecycle(resource, ctx)
    if found is None:
        return []
    _, state = found
    if state is None:
        return ["upgradePolicy.supportType is not set: EKS would pick it, and with it when the cluster is upgraded"]
    return [state.message] if state.level == "error" else []


def eks_version_support_ending(resource: Resource, ctx: Context) -> list[str]:
    """Advisory: an EKS cluster's version is within eks.WARN_DAYS of the end of the support its policy pays for.

    The warning `dlinfra validate` and `preview` print, raised in a real preview too, while there is time to move:
    the mandatory eks-version-supported takes over on the day after the end. Same source and dates.
    """
    found = _eks_lifecycle(resource, ctx)
    state = found[1] if found is not None else None
    return [state.message] if state is not None and state.level == "warning" else []


IAM_ROLE = "aws:iam/role:Role"
# Services that act for any account: a role they may assume names the account and source it is for.
# Sources: IAM user guide, "The confused deputy problem"; EKS guide "Prepare credentials for hybrid nodes" (SSM);
# CodeBuild guide "Allow CodeBuild to interact with other AWS services" (service role trust).
CONFUSED_DEPUTY_SERVICES = frozenset({"ssm.amazonaws.com", "codebuild.amazonaws.com"})


def service_trust_scoped(resource: Resource, ctx: Context) -> list[str]:
    """Roles that SSM or CodeBuild may assume limit it to this account and source (aws:SourceAccount, SourceArn)."""
    if resource.type != IAM_ROLE:
        return []
    document = resource.inputs.get("assumeRolePolicy")
    try:
        policy = json.loads(document) if isinstance(document, str) else _object(document)
    except json.JSONDecodeError:
        return ["assumeRolePolicy is not JSON"]
    out = []
    for statement in _objects(policy.get("Statement")):
        services = set(_items(_object(statement.get("Principal")).get("Service")))
        for service in sorted(services & CONFUSED_DEPUTY_SERVICES):
            keys = {key for block in _object(statement.get("Condition")).values() for key in _object(block)}
            missing = [k for k in ("aws:SourceAccount", "aws:SourceArn") if k not in keys]
            if missing:
                out.append(f"trusts {service} without {' and '.join(missing)} conditions (confused deputy)")
    return out


TLS_CERT_REQUEST = "tls:index/certRequest:CertRequest"
TLS_SIGNED_CERTS = ("tls:index/locallySignedCert:LocallySignedCert", "tls:index/selfSignedCert:SelfSignedCert")


def _domain_shaped(name: Any) -> bool:
    labels = str(name).rstrip(".").split(".")
    return len(labels) >= 2 and all(
        re.fullmatch(r"[a-z0-9*]([a-z0-9-]{0,61}[a-z0-9])?", label or "") for label in labels
    )


def server_certificates_name_a_domain(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Server certificates carry a domain-shaped DNS subject alternative name.

    ACM refuses to let AWS Client VPN use an imported server certificate without a domain name, and current TLS
    clients ignore the common name. Source: AWS Client VPN administrator guide, "Mutual authentication"; ACM
    user guide, "Prerequisites for importing certificates".
    """
    by_urn = {r.urn: r for r in resources}
    out = []
    for cert in resources:
        if cert.type not in TLS_SIGNED_CERTS or "server_auth" not in _items(cert.inputs.get("allowedUses")):
            continue
        if cert.type == TLS_SIGNED_CERTS[1]:
            names = _items(cert.inputs.get("dnsNames"))
        else:
            requests = [by_urn[d] for d in cert.dependencies if d in by_urn and by_urn[d].type == TLS_CERT_REQUEST]
            names = [n for request in requests for n in _items(request.inputs.get("dnsNames"))]
        if not any(_domain_shaped(n) for n in names):
            out.append(Violation(cert.urn, "server certificate has no domain-shaped DNS name: ACM will not use it"))
    return out


def client_vpn_revocable(resource: Resource, ctx: Context) -> list[str]:
    """A Client VPN endpoint that accepts client certificates can refuse one: a client connect handler checks who
    is still admitted (without it, every certificate the CA ever issued gets in until it expires). Federated
    sign-in is revocable at the identity provider. Source: AWS Client VPN administrator guide, "Connection
    authorization" and "Client certificate revocation lists"."""
    if resource.type != CLIENT_VPN_ENDPOINT:
        return []
    kinds = {str(o.get("type")) for o in _objects(resource.inputs.get("authenticationOptions"))}
    if "certificate-authentication" not in kinds:
        return []
    if _true(_object(resource.inputs.get("clientConnectOptions")).get("enabled")):
        return []
    return ["certificate sign-in without a client connect handler: a removed person's certificate still gets in"]


RULES: tuple[ResourceRule | StackRule, ...] = (
    StackRule(
        "multikueue-wired",
        "MultiKueue checks, configs and clusters are wired as Kueue requires",
        "mandatory",
        multikueue_wired,
    ),
    ResourceRule(
        "ebs-encrypted", "EBS volumes and launch template block devices are encrypted", "mandatory", ebs_encrypted
    ),
    ResourceRule("efs-encrypted", "EFS file systems are encrypted at rest", "mandatory", efs_encrypted),
    StackRule("s3-encrypted", "S3 buckets have a server-side encryption configuration", "mandatory", s3_encrypted),
    ResourceRule("fsx-encrypted", "FSx file systems use a customer-managed KMS key", "mandatory", fsx_encrypted),
    ResourceRule(
        "eks-secrets-encrypted", "EKS clusters encrypt Kubernetes secrets with KMS", "mandatory", eks_secrets_encrypted
    ),
    StackRule("s3-no-public-access", "S3 buckets block all public access", "mandatory", s3_no_public_access),
    ResourceRule("imdsv2-required", "Launch templates and instances require IMDSv2", "mandatory", imdsv2_required),
    ResourceRule(
        "no-world-ingress",
        "No security-group ingress from anywhere outside the allowlist",
        "mandatory",
        no_world_ingress,
    ),
    StackRule(
        "vpc-cidr-planned",
        "VPC CIDRs are the planned, disjoint blocks of the address plan",
        "mandatory",
        vpc_cidrs_planned,
    ),
    ResourceRule(
        "stateful-protected", "Stateful resources are protected against deletion", "mandatory", stateful_protected
    ),
    ResourceRule(
        "protect-only-stateful", "Only resources that hold data are protected", "mandatory", protect_only_stateful
    ),
    ResourceRule("required-tags", "Taggable AWS resources carry dlinfra's standard tags", "mandatory", required_tags),
    StackRule(
        "gpu-pool-scale-from-zero",
        "GPU pools carry cluster-autoscaler scale-from-zero tags",
        "mandatory",
        gpu_pools_scale_from_zero,
    ),
    ResourceRule(
        "vpn-strong-crypto", "Site VPN tunnels are IKEv2 only with strong proposals", "mandatory", vpn_strong_crypto
    ),
    StackRule("vpc-flow-logs", "Every VPC has a flow log", "advisory", vpc_flow_logs),
    ResourceRule(
        "client-vpn-connection-logs", "Client VPN endpoints log connections", "advisory", client_vpn_connection_logs
    ),
    ResourceRule("sg-no-inline-rules", "Security groups have no inline rules", "mandatory", sg_no_inline_rules),
    ResourceRule(
        "nodes-cluster-owned-tag",
        "Node groups tag instances kubernetes.io/cluster/<name>=owned",
        "mandatory",
        nodes_cluster_owned,
    ),
    ResourceRule(
        "service-trust-scoped",
        "Roles SSM or CodeBuild assume are scoped to this account and source",
        "mandatory",
        service_trust_scoped,
    ),
    StackRule(
        "s3-access-logs-delivered",
        "Buckets that receive access logs admit the S3 logging service and use SSE-S3",
        "mandatory",
        s3_access_logs_delivered,
    ),
    ResourceRule(
        "eks-version-supported",
        "EKS clusters name their upgrade policy and run a version it still supports",
        "mandatory",
        eks_version_supported,
    ),
    ResourceRule(
        "eks-version-support-ending",
        "EKS cluster versions are not about to leave the support their upgrade policy pays for",
        "advisory",
        eks_version_support_ending,
    ),
    StackRule(
        "server-cert-domain-san",
        "Server certificates name a domain in their subject alternative names",
        "mandatory",
        server_certificates_name_a_domain,
    ),
    ResourceRule(
        "client-vpn-revocable",
        "Client VPN certificate sign-in can refuse a removed person",
        "mandatory",
        client_vpn_revocable,
    ),
    ResourceRule(
        "explicit-provider",
        "AWS and Kubernetes resources use an explicit provider, in the regional stack's own region",
        "mandatory",
        explicit_provider,
    ),
    StackRule(
        "gpu-pools-no-auto-refresh",
        "GPU pools never replace running nodes by themselves (instance refresh, lifetime, AZ rebalance)",
        "mandatory",
        gpu_pools_no_auto_refresh,
    ),
    ResourceRule(
        "team-namespaces-pod-security",
        "Team namespaces enforce the baseline or restricted Pod Security Standard",
        "mandatory",
        team_namespaces_pod_security,
    ),
    ResourceRule(
        "drain-taints-not-tolerated",
        "Kueue flavors and workloads do not tolerate the maintenance, interruption or cordon taints",
        "mandatory",
        drain_taints_not_tolerated,
    ),
)
