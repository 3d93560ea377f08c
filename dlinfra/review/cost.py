"""Monthly cost estimate of each stack from its plan export and the pinned price table (docs/cost.md).

Pure: reads plan JSON (docs/plan-export.md) and dlinfra/data/prices.yaml, no Pulumi. Every `aws:` type a
plan holds must be priced, listed as not counted (with why), or known to be free; anything else, and any
price the table lacks for a region, is one CostError listing all of them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from dlinfra.errors import DlinfraError
from dlinfra.model import catalog, eks, gpu_sharing, instances
from dlinfra.review import dev_box_cost
from policy.dlinfra_policy.rules.capacity_blocks import block_window

PRICES_FILE = "data/prices.yaml"


class CostError(DlinfraError):
    """The price table or the assumptions cannot price a plan."""


# Usage nobody can read from a plan: each is a documented parameter, printed with every report.
# Values are per stack and per month.
DEFAULT_ASSUMPTIONS: Mapping[str, float] = {
    "nat_gb": 0.0,  # GB processed by the stack's NAT gateways together
    "tgw_gb": 0.0,  # GB the stack's attachments send into its transit gateway
    "client_vpn_connection_hours": 0.0,  # laptop connection-hours on the stack's Client VPN endpoints
    "efs_gb": 0.0,  # GB stored in the stack's EFS file systems (Standard class)
    "s3_gb": 0.0,  # GB stored in the stack's S3 buckets (Standard class)
}

# Billed by AWS but outside this estimate; the report prints these with the resource types found.
NOT_COUNTED: Mapping[str, str] = {
    "aws:cloudwatch/logGroup:LogGroup": "CloudWatch Logs ingestion and storage",
    "aws:cloudwatch/logStream:LogStream": "CloudWatch Logs ingestion and storage",
    "aws:ec2/flowLog:FlowLog": "VPC flow log delivery (CloudWatch Logs)",
    "aws:cloudwatch/eventRule:EventRule": "EventBridge custom events",
    "aws:cloudwatch/eventTarget:EventTarget": "EventBridge custom events",
    "aws:kms/key:Key": "KMS keys (per key-month) and requests",
    "aws:lambda/function:Function": "Lambda requests and duration",
    "aws:lambda/invocation:Invocation": "Lambda requests and duration",
    "aws:codebuild/project:Project": "CodeBuild build minutes (CI runner)",
    "aws:codebuild/webhook:Webhook": "CodeBuild build minutes (CI runner)",
    "aws:sqs/queue:Queue": "SQS requests",
    "aws:efs/backupPolicy:BackupPolicy": "AWS Backup storage of EFS",
    "aws:ssm/activation:Activation": "SSM advanced-tier on-premises instances, if enabled",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "S3 requests made by FSx import/export",
    "aws:cloudwatch/metricAlarm:MetricAlarm": "CloudWatch alarms, the dev boxes' idle metric, detailed monitoring",
}

# Always in the report: costs no plan resource stands for.
NOT_COUNTED_ALWAYS: tuple[str, ...] = (
    "data transfer between regions, between AZs and to the internet",
    "EBS volumes (node root volumes from the launch templates; EKS persistent volumes)",
    "S3 and EFS requests, EFS Infrequent Access and Elastic Throughput charges",
    "interface endpoint and transit gateway data processing beyond the assumptions",
    "capacity blocks without a price in the table (paid up front for their window: shown by window, not monthly)",
    "AWS Support plan, taxes, Savings Plans and Reserved Instance discounts",
)

# No charge of their own (configuration, or priced through another resource: launch templates through
# their auto scaling group, the transit gateway through its attachments).
FREE: frozenset[str] = frozenset(
    {
        "aws:autoscaling/lifecycleHook:LifecycleHook",
        "aws:acm/certificate:Certificate",
        "aws:ec2/customerGateway:CustomerGateway",
        "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
        "aws:ec2/internetGateway:InternetGateway",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:ec2/placementGroup:PlacementGroup",
        "aws:ec2/route:Route",
        "aws:ec2/routeTable:RouteTable",
        "aws:ec2/routeTableAssociation:RouteTableAssociation",
        "aws:ec2/securityGroup:SecurityGroup",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/vpc:Vpc",
        "aws:ec2clientvpn/authorizationRule:AuthorizationRule",
        "aws:ec2clientvpn/route:Route",
        "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter",
        "aws:ec2transitgateway/route:Route",
        "aws:ec2transitgateway/routeTable:RouteTable",
        "aws:ec2transitgateway/routeTableAssociation:RouteTableAssociation",
        "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation",
        "aws:ec2transitgateway/transitGateway:TransitGateway",
        "aws:efs/accessPoint:AccessPoint",
        "aws:efs/fileSystemPolicy:FileSystemPolicy",
        "aws:efs/mountTarget:MountTarget",
        "aws:eks/accessEntry:AccessEntry",
        "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
        "aws:eks/addon:Addon",
        "aws:eks/podIdentityAssociation:PodIdentityAssociation",
        "aws:iam/instanceProfile:InstanceProfile",
        "aws:iam/policy:Policy",
        "aws:iam/role:Role",
        "aws:iam/rolePolicy:RolePolicy",
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
        "aws:kms/alias:Alias",
        "aws:lambda/permission:Permission",
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
        "aws:s3/bucketLogging:BucketLogging",
        "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
        "aws:s3/bucketPolicy:BucketPolicy",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketVersioning:BucketVersioning",
        "aws:sqs/queuePolicy:QueuePolicy",
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    }
)


@dataclass(frozen=True)
class Price:
    """One price-table entry for one region."""

    key: str
    region: str
    usd: float
    unit: str  # what one usd buys: instance-hour, GB-month, ...
    source: str  # the AWS page the price is read from
    unverified: bool = False  # not confirmed on the source page (see note)
    note: str = ""
    copied_from: str | None = None  # no price found for this region: this region's price stands in


@dataclass(frozen=True)
class PriceTable:
    read_on: datetime.date
    currency: str
    hours_per_month: float
    prices: Mapping[tuple[str, str], Price]

    def get(self, key: str, region: str) -> Price | None:
        return self.prices.get((key, region))


def load_prices(path: Path | None = None) -> PriceTable:
    """The price table (default: the one shipped in dlinfra/data, with the lab's catalog prices over it, from the
    catalog.yaml beside the fleet last loaded); CostError naming a bad key."""
    where = str(path) if path else f"dlinfra/{PRICES_FILE}"
    text = path.read_text() if path else resources.files("dlinfra").joinpath(PRICES_FILE).read_text()
    data = YAML(typ="safe").load(text)
    if path is None and catalog.installed().prices:
        data["prices"] = catalog.merged_prices(data["prices"], catalog.installed().prices)
    prices: dict[tuple[str, str], Price] = {}
    try:
        for key, entry in data["prices"].items():
            for region, row in entry["regions"].items():
                prices[(key, region)] = Price(
                    key=key,
                    region=region,
                    usd=float(row["usd"]),
                    unit=str(entry["unit"]),
                    source=str(row.get("source", entry["source"])),
                    unverified=bool(row.get("unverified", entry.get("unverified", False))),
                    note=str(row.get("note", entry.get("note", ""))),
                    copied_from=row.get("copied_from"),
                )
        read_on = data["read_on"]
        if not isinstance(read_on, datetime.date):
            raise CostError("read_on must be a date (YYYY-MM-DD)", file=where, key="read_on")
        return PriceTable(read_on, str(data["currency"]), float(data["hours_per_month"]), prices)
    except (KeyError, TypeError, ValueError) as exc:
        raise CostError(f"malformed price table: {exc!r}", file=where) from None


def parse_assumptions(pairs: Sequence[str]) -> dict[str, float]:
    """`key=value` strings over the defaults; CostError naming an unknown key or a bad number."""
    out = dict(DEFAULT_ASSUMPTIONS)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in DEFAULT_ASSUMPTIONS:
            known = ", ".join(DEFAULT_ASSUMPTIONS)
            raise CostError(f"--assume {pair!r}: expected key=value with key one of {known}", key="--assume")
        try:
            number = float(value)
        except ValueError:
            raise CostError(f"--assume {pair!r}: {value!r} is not a number", key="--assume") from None
        if number < 0:
            raise CostError(f"--assume {pair!r}: must be 0 or more", key="--assume")
        out[key] = number
    return out


@dataclass(frozen=True)
class LineItem:
    """One billable thing of a stack at min and at max size, per month."""

    label: str  # what is billed: "pool train-h100 (p5.48xlarge)", "NAT gateways"
    price_key: str  # key in the price table ("" when nothing is priced, e.g. billed separately)
    unit: str  # the price's unit
    usd_each: float  # price per unit
    quantity_min: float  # units per month at min size
    quantity_max: float  # units per month at max size
    usd_min: float
    usd_max: float
    detail: str  # the arithmetic, e.g. "3 x 730 h"
    note: str = ""  # assumptions and caveats: first override priced, spot priced on demand, ...


@dataclass(frozen=True)
class StackCost:
    stack: str
    region: str  # "global" for the global stack (its items carry their own regions)
    items: tuple[LineItem, ...]

    @property
    def usd_min(self) -> float:
        return round(sum(i.usd_min for i in self.items), 2)

    @property
    def usd_max(self) -> float:
        return round(sum(i.usd_max for i in self.items), 2)


@dataclass(frozen=True)
class Report:
    stacks: tuple[StackCost, ...]
    assumptions: Mapping[str, float]
    price_date: datetime.date
    hours_per_month: float
    not_counted: tuple[str, ...]
    unverified_prices: tuple[str, ...]  # "key (region): note" for each unverified or copied price used

    @property
    def usd_min(self) -> float:
        return round(sum(s.usd_min for s in self.stacks), 2)

    @property
    def usd_max(self) -> float:
        return round(sum(s.usd_max for s in self.stacks), 2)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "dlinfra.cost/v1",
            "currency": "USD",
            "period": "month",
            "hours_per_month": self.hours_per_month,
            "price_date": self.price_date.isoformat(),
            "assumptions": dict(self.assumptions),
            "stacks": [
                {
                    "stack": s.stack,
                    "region": s.region,
                    "usd_min": s.usd_min,
                    "usd_max": s.usd_max,
                    "items": [asdict(i) for i in s.items],
                }
                for s in self.stacks
            ],
            "usd_min": self.usd_min,
            "usd_max": self.usd_max,
            "not_counted": list(self.not_counted),
            "unverified_prices": list(self.unverified_prices),
        }


class _Pricer:
    """Collects line items for one stack, and every price it could not find."""

    def __init__(self, table: PriceTable, missing: list[str], used: dict[tuple[str, str], Price]) -> None:
        self.table = table
        self.missing = missing
        self.used = used
        self.items: list[LineItem] = []

    def add(
        self,
        label: str,
        key: str,
        region: str,
        qmin: float,
        qmax: float,
        detail: str,
        note: str = "",
        where: str = "",
    ) -> None:
        price = self.table.get(key, region)
        if price is None:
            self.missing.append(f"{key} in {region} ({where or label})")
            return
        self.used[(key, region)] = price
        self.items.append(
            LineItem(
                label=label,
                price_key=key,
                unit=price.unit,
                usd_each=price.usd,
                quantity_min=qmin,
                quantity_max=qmax,
                usd_min=round(qmin * price.usd, 2),
                usd_max=round(qmax * price.usd, 2),
                detail=detail,
                note=note,
            )
        )

    def separate(self, label: str, detail: str, note: str) -> None:
        self.items.append(LineItem(label, "", "", 0.0, 0.0, 0.0, 0.0, 0.0, detail, note))


def _region_of(resource: Mapping[str, Any], stack_region: str | None) -> str:
    """The stack's region; in the global stack, the region in the resource's ARN or provider name."""
    if stack_region:
        return stack_region
    arn = str((resource.get("outputs") or {}).get("arn", ""))
    if arn.startswith("arn:aws:") and arn.count(":") >= 4:
        return arn.split(":")[3]
    provider = str(resource.get("provider") or "")
    name = provider.split("::")[-2] if provider.count("::") >= 2 else ""
    return name.removeprefix("aws-") or "unknown"


def _num(value: Any) -> float:
    return float(value) if value is not None else 0.0


def _pool_name(asg: Mapping[str, Any]) -> str:
    return str(asg["name"]).removeprefix("pool-").removesuffix("-asg")


def _price_pools(p: _Pricer, resources_: Sequence[Mapping[str, Any]], region: str) -> None:
    templates = {r["id"]: r for r in resources_ if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate"}
    hours = p.table.hours_per_month
    for asg in (r for r in resources_ if r["type"] == "aws:autoscaling/group:Group"):
        inputs = asg["inputs"]
        lo, hi = int(_num(inputs.get("minSize"))), int(_num(inputs.get("maxSize")))
        notes: list[str] = []
        mixed = inputs.get("mixedInstancesPolicy")
        if mixed:
            spec = mixed["launchTemplate"]["launchTemplateSpecification"]
            template = templates.get(spec.get("launchTemplateId"), {})
            overrides = [o["instanceType"] for o in mixed["launchTemplate"].get("overrides") or []]
            instance_type = overrides[0] if overrides else template.get("inputs", {}).get("instanceType")
            if len(overrides) > 1:
                notes.append(f"first of {len(overrides)} overrides priced ({', '.join(overrides)})")
            dist = mixed.get("instancesDistribution") or {}
            if _num(dist.get("onDemandPercentageAboveBaseCapacity", 100)) < 100:
                base = int(_num(dist.get("onDemandBaseCapacity")))
                notes.append(f"spot share above {base} on-demand priced on demand (an upper bound)")
        else:
            template = templates.get((inputs.get("launchTemplate") or {}).get("id"), {})
            instance_type = template.get("inputs", {}).get("instanceType")
        label = f"pool {_pool_name(asg)} ({instance_type})"
        if not instance_type:
            p.missing.append(f"instance type of {asg['name']} (no launch template instanceType or override)")
            continue
        t_inputs = template.get("inputs", {})
        market = (t_inputs.get("instanceMarketOptions") or {}).get("marketType")
        reserved = (t_inputs.get("capacityReservationSpecification") or {}).get("capacityReservationTarget")
        detail = f"{lo}..{hi} x {hours:g} h"
        if market == "capacity-block":
            _price_block(p, resources_, asg, label, f"capacity-block/{instance_type}", region)
            continue
        if reserved:
            notes.append("capacity reservation: billed at the on-demand rate while reserved, used or not")
        notes += _share_notes(p, asg, region, instance_type)
        p.add(label, f"ec2/{instance_type}", region, lo * hours, hi * hours, detail, "; ".join(notes), asg["name"])


def _share_notes(p: _Pricer, asg: Mapping[str, Any], region: str, instance_type: str) -> list[str]:
    """A shared pool's price per share and hour (dlinfra.model.gpu_sharing.share_prices), from its group's tag."""
    value = {t.get("key"): t.get("value") for t in asg["inputs"].get("tags") or []}.get(gpu_sharing.SHARES_TAG)
    price = p.table.get(f"ec2/{instance_type}", region)
    if price is None or not value or instance_type not in instances.all_types():
        return []
    return [gpu_sharing.share_price_note(price.usd, str(value), instances.lookup(instance_type).gpus)]


def _block_window(
    resources_: Sequence[Mapping[str, Any]], asg: Mapping[str, Any]
) -> tuple[int, datetime.datetime, datetime.datetime] | None:
    """(instances, start, end) of the Capacity Block a pool's group launches into, from its keeper's window
    (components/capacity_block.py: the function's environment names the group, its max and the window)."""
    name = asg["inputs"].get("name")
    windows = [
        w
        for r in resources_
        if r["type"] == "aws:lambda/function:Function"
        and (w := block_window(r.get("inputs") or {})) is not None
        and w.group == name
    ]
    if len(windows) != 1:
        return None
    return windows[0].max_size, windows[0].opens_at, windows[0].ends_at


def _price_block(
    p: _Pricer, resources_: Sequence[Mapping[str, Any]], asg: Mapping[str, Any], label: str, key: str, region: str
) -> None:
    """A Capacity Block is paid up front for its whole window ("Capacity Blocks pricing and billing"), used or not:
    instances x hours of the window at the block's hourly rate, once, never a monthly on-demand estimate."""
    window = _block_window(resources_, asg)
    note = "capacity block: paid up front for its window, once (not monthly), used or not"
    if window is None:
        p.separate(label, "window unknown", note + "; not in this estimate")
        return
    count, start, end = window
    hours = (end - start).total_seconds() / 3600
    detail = f"{count} x {hours:g} h, window {start:%Y-%m-%d %H:%M}..{end:%Y-%m-%d %H:%M} UTC"
    if p.table.get(key, region) is None:
        # Block prices move with supply and demand (the offering's UpfrontFee): price them when the table has one.
        p.separate(label, detail, note + f"; no {key} price in the table, so not in this estimate")
        return
    p.add(label, key, region, count * hours, count * hours, detail, note, asg["name"])


def _eks_extended(cluster: Mapping[str, Any], on: datetime.date) -> tuple[bool, str]:
    """Whether the cluster pays the extended-support rate on this date, and why."""
    inputs = cluster["inputs"]
    policy = str((inputs.get("upgradePolicy") or {}).get("supportType", "EXTENDED")).lower()
    version = str(inputs.get("version"))
    try:
        standard_end = eks.support_end(version, "standard")
    except KeyError:
        raise CostError(f"Kubernetes {version} has no support dates in dlinfra/data/eks.yaml") from None
    if policy == "extended" and on > standard_end:
        return True, f"{version} left standard support on {standard_end}; upgrade policy EXTENDED"
    return False, f"{version} in standard support until {standard_end}"


def price_stack(
    plan: Mapping[str, Any],
    table: PriceTable,
    assumptions: Mapping[str, float],
    on: datetime.date,
    *,
    missing: list[str],
    used: dict[tuple[str, str], Price],
) -> StackCost:
    """Line items of one plan export; unpriced things go to `missing`."""
    role = plan["role"]
    stack_region = role.get("region")
    resources_: list[Mapping[str, Any]] = plan["resources"]
    hours = table.hours_per_month
    p = _Pricer(table, missing, used)
    region = stack_region or "global"

    def of(type_: str) -> list[Mapping[str, Any]]:
        return [r for r in resources_ if r["type"] == type_]

    for r in resources_:
        t = r["type"]
        if t.startswith("aws:") and t not in FREE and t not in NOT_COUNTED and t not in PRICED:
            missing.append(
                f"resource type {t} ({r['name']}): add it to dlinfra/review/cost.py (priced, free or not counted)"
            )

    if stack_region:
        _price_pools(p, resources_, stack_region)
        for box in dev_box_cost.items(resources_, hours):
            p.add(box.label, box.price_key, stack_region, box.hours_min, box.hours_max, box.detail, box.note, box.where)
    for cluster in of("aws:eks/cluster:Cluster"):
        extended, why = _eks_extended(cluster, on)
        key = "eks_extended" if extended else "eks_standard"
        p.add("EKS control plane", key, _region_of(cluster, stack_region), hours, hours, f"1 x {hours:g} h", why)

    def count(type_: str, label: str, key: str, unit_word: str, note: str = "", per: int = 1) -> int:
        by_region: dict[str, int] = {}
        for r in of(type_):
            by_region[_region_of(r, stack_region)] = by_region.get(_region_of(r, stack_region), 0) + per
        for reg, n in sorted(by_region.items()):
            suffix = f" ({reg})" if not stack_region else ""
            p.add(f"{label}{suffix}", key, reg, n * hours, n * hours, f"{n} {unit_word} x {hours:g} h", note)
        return sum(by_region.values())

    nat = count("aws:ec2/natGateway:NatGateway", "NAT gateways", "nat_gateway", "gateways")
    if nat:
        gb = assumptions["nat_gb"]
        p.add("NAT data processed", "nat_gateway_gb", region, gb, gb, f"{gb:g} GB (assumption nat_gb)")
    count("aws:ec2/eip:Eip", "public IPv4 addresses (EIPs)", "public_ipv4", "addresses")
    tgw = count("aws:ec2transitgateway/vpcAttachment:VpcAttachment", "TGW VPC attachments", "tgw_attachment", "att.")
    vpn_attached = [r for r in of("aws:ec2/vpnConnection:VpnConnection") if r["inputs"].get("transitGatewayId")]
    if vpn_attached:
        n = len(vpn_attached)
        tgw += n
        p.add("TGW VPN attachments", "tgw_attachment", region, n * hours, n * hours, f"{n} att. x {hours:g} h")
    tgw += count(
        "aws:ec2transitgateway/peeringAttachment:PeeringAttachment",
        "TGW peering attachments",
        "tgw_attachment",
        "att.",
        "counted once per peering, in the requester's region",
    )
    if tgw and stack_region:
        gb = assumptions["tgw_gb"]
        p.add("TGW data processed", "tgw_gb", region, gb, gb, f"{gb:g} GB (assumption tgw_gb)")
    count("aws:ec2/vpnConnection:VpnConnection", "Site-to-Site VPN connections", "vpn_connection", "conn.")
    count(
        "aws:ec2clientvpn/networkAssociation:NetworkAssociation",
        "Client VPN subnet associations",
        "client_vpn_association",
        "assoc.",
    )
    if of("aws:ec2clientvpn/endpoint:Endpoint"):
        h = assumptions["client_vpn_connection_hours"]
        p.add(
            "Client VPN connections",
            "client_vpn_connection",
            region,
            h,
            h,
            f"{h:g} connection-h (assumption client_vpn_connection_hours)",
        )
    interface = [r for r in of("aws:ec2/vpcEndpoint:VpcEndpoint") if r["inputs"].get("vpcEndpointType") == "Interface"]
    if interface:
        azs = sum(len(r["inputs"].get("subnetIds") or []) for r in interface)
        p.add(
            "interface VPC endpoints",
            "interface_endpoint",
            region,
            azs * hours,
            azs * hours,
            f"{len(interface)} endpoints, {azs} endpoint-AZs x {hours:g} h",
            "gateway endpoints are free",
        )
    for fs in of("aws:fsx/lustreFileSystem:LustreFileSystem"):
        inputs = fs["inputs"]
        deployment = str(inputs.get("deploymentType"))
        tier = int(_num(inputs.get("perUnitStorageThroughput")))
        gib = _num(inputs.get("storageCapacity"))
        key = f"fsx_lustre_{deployment.lower().replace('_', '')}_{tier}"
        p.add(
            f"FSx for Lustre {fs['name']}",
            key,
            region,
            gib,
            gib,
            f"{gib:g} GiB {deployment} at {tier} MB/s/TiB",
            "declared capacity, billed whether used or not; backups not counted",
            fs["name"],
        )
    if of("aws:efs/fileSystem:FileSystem"):
        gb = assumptions["efs_gb"]
        p.add("EFS storage", "efs_standard", region, gb, gb, f"{gb:g} GB-month (assumption efs_gb)")
    if of("aws:s3/bucket:Bucket"):
        gb, n = assumptions["s3_gb"], len(of("aws:s3/bucket:Bucket"))
        p.add("S3 storage", "s3_standard", region, gb, gb, f"{gb:g} GB-month in {n} buckets (assumption s3_gb)")
    return StackCost(stack=plan["stack"], region=region, items=tuple(p.items))


# Types whose cost price_stack computes (directly, or through a resource it reads with them).
PRICED: frozenset[str] = frozenset(
    {
        "aws:autoscaling/group:Group",
        "aws:ec2/instance:Instance",
        "aws:eks/cluster:Cluster",
        "aws:ec2/natGateway:NatGateway",
        "aws:ec2/eip:Eip",
        "aws:ec2transitgateway/vpcAttachment:VpcAttachment",
        "aws:ec2transitgateway/peeringAttachment:PeeringAttachment",
        "aws:ec2/vpnConnection:VpnConnection",
        "aws:ec2clientvpn/endpoint:Endpoint",
        "aws:ec2clientvpn/networkAssociation:NetworkAssociation",
        "aws:ec2/vpcEndpoint:VpcEndpoint",
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        "aws:efs/fileSystem:FileSystem",
        "aws:s3/bucket:Bucket",
    }
)


def estimate(
    plans: Iterable[Mapping[str, Any]],
    table: PriceTable | None = None,
    assumptions: Mapping[str, float] | None = None,
    on: datetime.date | None = None,
) -> Report:
    """The cost report of these plans; CostError listing every type or price the table cannot cover."""
    table = table or load_prices()
    assumed = {**DEFAULT_ASSUMPTIONS, **(assumptions or {})}
    on = on or eks.today()
    missing: list[str] = []
    used: dict[tuple[str, str], Price] = {}
    plans = list(plans)
    stacks = tuple(price_stack(plan, table, assumed, on, missing=missing, used=used) for plan in plans)
    if missing:
        raise CostError(
            "cannot price: " + "; ".join(sorted(set(missing))) + ". Add the prices to dlinfra/data/prices.yaml",
            file=f"dlinfra/{PRICES_FILE}",
        )
    found = sorted({t for plan in plans for r in plan["resources"] if (t := r["type"]) in NOT_COUNTED})
    not_counted = tuple(NOT_COUNTED_ALWAYS) + tuple(sorted({NOT_COUNTED[t] for t in found}))
    flagged = tuple(
        f"{k} ({reg}): " + ("; ".join(filter(None, (f"copied from {p.copied_from}" if p.copied_from else "", p.note))))
        for (k, reg), p in sorted(used.items())
        if p.unverified or p.copied_from
    )
    return Report(stacks, assumed, table.read_on, table.hours_per_month, not_counted, flagged)
