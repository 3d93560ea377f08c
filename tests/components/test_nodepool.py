"""NodePool under the mock engine, for every pool of the reference fleet, plus golden user data."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from components import nodepool
from dlinfra.model import dns, gpu_health, gpu_sharing, instances, planner, replacement, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.pools import DRAIN_MARGIN_SECONDS, GpuCheck, GpuSharing
from dlinfra.offline import engine, plan_export
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

GOLDEN = Path(__file__).parent / "golden"
CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}
ASG = "aws:autoscaling/group:Group"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
CA = "k8s.io/cluster-autoscaler"

PROGRAM = """
from pathlib import Path
from stacks.context import aws_provider, load_context
from stacks.compute import declare_pools
ctx = load_context(Path({root!r}))
subnets = {{az: "subnet-" + az for az in ctx.fleet.azs(ctx.role.region)}}
provider = aws_provider(ctx.role.region)
declare_pools(ctx, vpc_id="vpc-0test", private_subnet_ids=subnets, provider=provider)
"""


@pytest.fixture(scope="module")
def pools(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], dict[str, list[plan_export.ResourceRecord]]]:
    """(stack, pool) -> resources by type, for every regional stack of the reference fleet."""
    program = tmp_path_factory.mktemp("prog") / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    fleet = load_fleet(REFERENCE_FLEET).fleet
    out: dict[tuple[str, str], dict[str, list[plan_export.ResourceRecord]]] = {}
    for role in stackroles.roles(fleet):
        if role.kind != "regional":
            continue
        result = engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={}, program=program)
        names = [r.name.removeprefix("pool-") for r in result.resources if r.type == "dlinfra:compute:NodePool"]
        for pool in names:
            out[(role.name, pool)] = {}
        for r in result.resources:
            owners = [p for p in names if r.name.startswith(f"pool-{p}-")]
            if owners:  # the longest matching pool name owns the resource
                out[(role.name, max(owners, key=len))].setdefault(r.type, []).append(r)
    return out


def _expected_pools() -> list[tuple[str, str]]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    return [
        (f"{env}-{region}", pool) for env, region in fleet.regional_stacks() for pool in fleet.pools_in(env, region)
    ]


def test_every_fleet_pool_is_declared(pools: dict) -> None:
    assert sorted(pools) == sorted(_expected_pools())


@pytest.mark.parametrize(("stack", "pool"), _expected_pools())
def test_pool(pools: dict, stack: str, pool: str) -> None:
    env, region = stack.split("-", 1)
    fleet = load_fleet(REFERENCE_FLEET).fleet
    spec = fleet.environments[env].node_pools[pool]
    itype = instances.lookup(fleet.pool_types(env, region, pool)[0])  # the first type sold in the region
    res = pools[(stack, pool)]
    (asg,) = res[ASG]
    (lt,) = res[LT]
    tags = {t["key"]: t["value"] for t in asg.inputs["tags"]}
    # Auto-discovery and scale-from-zero tags.
    assert tags[f"{CA}/enabled"] == "true"
    assert tags[f"{CA}/dlinfra-{env}-{_code(region)}-eks"] == "owned"
    if spec.gpu_sharing is not None:
        # A shared pool advertises its shares and nvidia.com/gpu "0" (the autoscaler's AWS provider would fill in the
        # type's GPUs), says what each GPU offers for the rule, and sets its own scale-down threshold.
        offered = gpu_sharing.per_node(spec.gpu_sharing, itype.gpus)
        assert {k: v for k, v in tags.items() if k.startswith(f"{CA}/node-template/resources/")} == {
            f"{CA}/node-template/resources/nvidia.com/gpu": "0",
            **{f"{CA}/node-template/resources/{r}": str(n) for r, n in offered.items()},
        }
        assert float(tags[f"{CA}/node-template/autoscaling-options/scaledownutilizationthreshold"]) == 1e-6
        assert tags[gpu_sharing.SHARES_TAG] == gpu_sharing.shares_tag(spec.gpu_sharing)
        assert tags[f"{CA}/node-template/label/nvidia.com/device-plugin.config"] == f"pool-{pool}"
        assert f"{CA}/node-template/label/k8s.amazonaws.com/accelerator" not in tags
    elif spec.kind == "gpu":
        assert tags[f"{CA}/node-template/resources/nvidia.com/gpu"] == str(itype.gpus)
    else:
        assert f"{CA}/node-template/resources/nvidia.com/gpu" not in tags
    if spec.gpu_sharing is None:  # whole-GPU and CPU pools keep the cluster-wide thresholds
        assert not any("/autoscaling-options/" in k for k in tags)
    if spec.kind == "gpu":
        # NVIDIA's product name as its feature discovery writes it, and dlinfra's short name (Kueue's flavors).
        assert tags[f"{CA}/node-template/label/nvidia.com/gpu.product"] == str(itype.gpu_product).replace(" ", "-")
        assert tags[f"{CA}/node-template/label/dlinfra.io/gpu-model"] == itype.gpu_model
    for taint in spec.taints:
        assert tags[f"{CA}/node-template/taint/{taint.key}"] == f"{taint.value}:{taint.effect}"
    for key, value in spec.labels.items():
        assert tags[f"{CA}/node-template/label/{key}"] == value
    # EFA pools carry the label the EFA device plugin selects, on the nodes and in the scale-from-zero template.
    user_data = base64.b64decode(lt.inputs["userData"]).decode()
    # The kubelet points pods at the node's NodeLocal DNS cache first, kube-dns second.
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    kube_dns = dns.kube_dns_ip(str(plan.cidr(f"service/{env}/{region}")))
    assert f"--cluster-dns '169.254.20.10,{kube_dns}'" in user_data
    # GPU nodes register with the burn-in taint and start the check against their pool's expectation (one per type
    # the pool launches in the region); the autoscaler's template leaves the taint out (a startup taint).
    registered = re.search(r"^taints='([^']*)'$", user_data, re.M)
    assert registered is not None and '--register-with-taints "${taints}"' in user_data
    assert registered[1].split(",") == [f"{t.key}={t.value}:{t.effect}" for t in spec.taints] or not spec.taints
    burn_in = "{}={}:{}".format(*gpu_health.BURN_IN_TAINT)
    assert f"{CA}/node-template/taint/{gpu_health.BURN_IN_TAINT[0]}" not in tags
    if spec.kind == "gpu":
        assert f'taints="${{taints:+${{taints}},}}{burn_in}"' in user_data
        expect = re.search(r"<<'DLINFRA_GPU_EXPECTATION'\n(.*)\nDLINFRA_GPU_EXPECTATION\n", user_data)
        assert expect is not None and f"systemctl start --no-block {gpu_health.CHECK_UNIT}" in user_data
        document = json.loads(expect[1])
        by_type = document["instance_types"]
        assert sorted(by_type) == sorted(set(fleet.pool_types(env, region, pool)))
        assert by_type[itype.name]["gpu_count"] == itype.gpus and document["failing_xids"]
        assert by_type[itype.name]["dcgm_level"] == spec.burn_in.dcgm_level
        assert len(user_data.encode()) <= 16384  # EC2's limit on user data, before base64
    else:
        assert burn_in not in user_data and gpu_health.EXPECT_PATH not in user_data
    efa_label = f"{nodepool.EFA_LABEL}=true"
    if spec.efa:
        assert tags[f"{CA}/node-template/label/{nodepool.EFA_LABEL}"] == "true" and efa_label in user_data
    else:
        assert f"{CA}/node-template/label/{nodepool.EFA_LABEL}" not in tags and efa_label not in user_data
    assert tags["environment"] == env and tags["managed-by"] == "pulumi-dlinfra"
    # Self-managed node convention: instances say which cluster owns them, from launch on.
    cluster = f"dlinfra-{env}-{_code(region)}-eks"
    (owned,) = [t for t in asg.inputs["tags"] if t["key"] == f"kubernetes.io/cluster/{cluster}"]
    assert owned["value"] == "owned" and owned["propagateAtLaunch"] is True
    (instance_tags,) = [t["tags"] for t in lt.inputs["tagSpecifications"] if t["resourceType"] == "instance"]
    assert instance_tags[f"kubernetes.io/cluster/{cluster}"] == "owned"
    # The pool's security group has no inline rules; each rule is its own resource.
    (group,) = res["aws:ec2/securityGroup:SecurityGroup"]
    assert "ingress" not in group.inputs and "egress" not in group.inputs
    egress = res["aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"]
    to_world = {(r.inputs["fromPort"], r.inputs["cidrIpv4"]) for r in egress if r.inputs.get("cidrIpv4") == "0.0.0.0/0"}
    assert to_world == {(443.0, "0.0.0.0/0"), (80.0, "0.0.0.0/0")}
    # Who reaches nodes and pods is the cluster's node group, which every pool carries; the pool's own group
    # admits only itself, and only where EFA needs it.
    ingress = res.get("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", [])
    if spec.efa:
        (self_rule,) = ingress
        assert self_rule.inputs["referencedSecurityGroupId"] == self_rule.inputs["securityGroupId"] == group.id
    else:
        assert ingress == []
    # Declared without a cluster here, so only the pool's group; with one, the cluster's node group follows it
    # (tests/checks/reach: a denial names "pool-<p>-sg, cluster-nodes-sg").
    groups = lt.inputs.get("vpcSecurityGroupIds") or lt.inputs["networkInterfaces"][0]["securityGroups"]
    assert groups == [group.id]
    # Sizes, drain hook, refresh.
    block = spec.capacity_reservations.get(region)
    if block is not None and block.type == "capacity_block":
        # Declared closed: the block's window opens and drains it (components/capacity_block.py).
        assert (asg.inputs["minSize"], asg.inputs["maxSize"]) == (0, 0)
        assert {"minSize", "maxSize"} <= set(asg.ignore_changes)
    else:
        assert (asg.inputs["minSize"], asg.inputs["maxSize"]) == (spec.min_size, spec.max_size)
    # The group keeps the hook it was created with: any change to initialLifecycleHooks replaces the group (the
    # replacement table), which would terminate every node without a drain; the apply ignores it after creation.
    (initial,) = asg.inputs["initialLifecycleHooks"]
    assert initial["heartbeatTimeout"] == nodepool.INITIAL_HOOK_TIMEOUT_SECONDS
    assert "initialLifecycleHooks" in asg.ignore_changes
    assert replacement.table().forced(ASG, asg.inputs, {**asg.inputs, "initialLifecycleHooks": []})[0]
    # A hook of the same name, updated in place, holds a terminating node for the pool's checkpoint grace plus the
    # drain margin (the disruption contract): train-h100's 1800 s in the reference fleet, 900 s by default.
    (hook,) = res[HOOK]
    assert hook.inputs["name"] == initial["name"] and hook.inputs["autoscalingGroupName"] == asg.inputs["name"]
    assert hook.inputs["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hook.inputs["defaultResult"] == "CONTINUE"
    assert hook.inputs["heartbeatTimeout"] == spec.checkpoint_grace + DRAIN_MARGIN_SECONDS <= 7200
    longer = {**hook.inputs, "heartbeatTimeout": hook.inputs["heartbeatTimeout"] + 600}
    assert not replacement.table().forced(HOOK, hook.inputs, longer)[0]
    # A new AMI or user data rolls CPU pools by itself; GPU pools only by `dlinfra pool roll`.
    if spec.kind == "gpu":
        assert "instanceRefresh" not in asg.inputs and "maxInstanceLifetime" not in asg.inputs
    else:
        refresh = asg.inputs["instanceRefresh"]
        assert refresh["strategy"] == "Rolling" and refresh["preferences"]["skipMatching"] is True
        assert refresh["preferences"]["minHealthyPercentage"] >= 90
    # Either way the group follows the template's latest version, so new nodes boot the new image.
    version = (asg.inputs.get("launchTemplate") or {}).get("version") or asg.inputs["mixedInstancesPolicy"][
        "launchTemplate"
    ]["launchTemplateSpecification"]["version"]
    assert version == str(int(lt.outputs["latestVersion"]))
    assert "AZRebalance" in asg.inputs["suspendedProcesses"]
    assert "desiredCapacity" in asg.ignore_changes
    # IMDSv2 and encryption.
    meta = lt.inputs["metadataOptions"]
    assert meta["httpTokens"] == "required"
    assert meta["httpPutResponseHopLimit"] == (2 if spec.pod_imds_access else 1)
    (root,) = lt.inputs["blockDeviceMappings"]
    assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
    # EFA: interfaces per network card, one AZ, and a cluster placement group unless the pool is on reserved
    # capacity (a Capacity Block is placed already; a reservation made outside our group never fits in it).
    zones = asg.inputs["vpcZoneIdentifiers"]
    reservation = spec.capacity_reservations.get(region)
    if spec.efa:
        nics = lt.inputs["networkInterfaces"]
        assert len(nics) == itype.efa_interfaces
        assert [n["networkCardIndex"] for n in nics] == list(range(itype.efa_interfaces))
        assert nics[0]["interfaceType"] == "efa" and all(n["interfaceType"] == "efa-only" for n in nics[1:])
        assert tags[f"{CA}/node-template/resources/vpc.amazonaws.com/efa"] == str(itype.efa_interfaces)
        if reservation:
            assert "placement" not in lt.inputs and "aws:ec2/placementGroup:PlacementGroup" not in res
        else:
            assert lt.inputs["placement"]["groupName"]
            (pg,) = res["aws:ec2/placementGroup:PlacementGroup"]
            assert pg.inputs["strategy"] == "cluster"
        assert len(zones) == 1
    else:
        assert "networkInterfaces" not in lt.inputs and "placement" not in lt.inputs
        assert len(zones) == 3
    # Spot mix for CPU pools; GPU pools on demand with their launch template.
    if spec.spot:
        dist = asg.inputs["mixedInstancesPolicy"]["instancesDistribution"]
        assert dist["onDemandBaseCapacity"] == spec.spot.on_demand_base
        assert dist["onDemandPercentageAboveBaseCapacity"] == spec.spot.on_demand_percentage_above_base
        overrides = asg.inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
        assert [o["instanceType"] for o in overrides] == list(spec.instance_types)
        assert asg.inputs["capacityRebalance"] is True
    else:
        assert "mixedInstancesPolicy" not in asg.inputs and asg.inputs["launchTemplate"]["id"] == lt.id
    if reservation:
        target = lt.inputs["capacityReservationSpecification"]["capacityReservationTarget"]
        assert target["capacityReservationId"] == reservation.id
        assert lt.inputs["instanceMarketOptions"]["marketType"] == "capacity-block"
        # The pool's subnet is the one in the reservation's zone (by zone id; the program's subnets are keyed by AZ).
        assert zones == [f"subnet-{fleet.pool_zones(env, region, pool)[0]}"]
        assert fleet.zone_id(region, fleet.pool_zones(env, region, pool)[0]) == reservation.zone_id
    # Least privilege: worker, ECR read-only, SSM; no CNI policy (the VPC CNI uses Pod Identity).
    arns = sorted(
        a.inputs["policyArn"].rsplit("/", 1)[1] for a in res["aws:iam/rolePolicyAttachment:RolePolicyAttachment"]
    )
    assert arns == [
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonEKSWorkerNodePolicy",
        "AmazonSSMManagedInstanceCore",
    ]
    # User data only joins the cluster.
    user_data = base64.b64decode(lt.inputs["userData"]).decode()
    assert "dlinfra-node-join" in user_data and "apt-get" not in user_data


def _code(region: str) -> str:
    from dlinfra.model.naming import region_code

    return region_code(region)


@pytest.mark.parametrize(
    ("itype", "count"), [("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("p4d.24xlarge", 4), ("g6.48xlarge", 1)]
)
def test_efa_interfaces_follow_the_table(itype: str, count: int) -> None:
    nics = nodepool.efa_interfaces(itype)
    assert len(nics) == count
    assert nics[0] == nodepool.EfaInterface(network_card_index=0, device_index=0, interface_type="efa")
    assert all(n.interface_type == "efa-only" and n.device_index == 1 for n in nics[1:])


def test_user_data_golden() -> None:
    rendered = nodepool.render_user_data(
        pool="train-h100",
        cluster_name="dlinfra-prod-usw2-eks",
        region="us-west-2",
        labels={"dlinfra.io/pool": "train-h100", "nvidia.com/gpu.product": "H100"},
        taints=[("nvidia.com/gpu", "true", "NoSchedule")],
        max_pods=100,
        cluster_dns=("169.254.20.10", "172.20.0.10"),
        gpu_expectation='{"instance_types":{"p5.48xlarge":{"gpu_count":8}}}',
    )
    golden = GOLDEN / "user-data-train-h100.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text()


@pytest.mark.parametrize(
    ("style", "product"), [("nvidia", "NVIDIA-A100-SXM4-80GB"), ("short", "A100")], ids=["nvidia", "short"]
)
def test_a_gpu_pool_s_nodes_carry_both_model_labels(style: str, product: str) -> None:
    """dlinfra's short name for Kueue's flavors; in NVIDIA's key the product name, or, for an environment whose
    admitted jobs still select it (gpu_product_label: short), the short name."""
    args = nodepool.NodePoolArgs(
        names=_names(),
        pool="train-a100",
        kind="gpu",
        cluster_name="c",
        ami_id="ami-0123456789abcdef0",
        instance_types=["p4de.24xlarge"],
        subnet_ids={"us-west-2a": "s-a"},
        vpc_id="vpc-1",
        cluster_dns=("169.254.20.10",),
        gpu_product_label=style,  # type: ignore[arg-type]
    )
    labels = nodepool.node_labels(args)
    assert (labels["dlinfra.io/gpu-model"], labels["nvidia.com/gpu.product"]) == ("A100", product)
    tags = nodepool.autoscaler_tags(args)
    assert tags[f"{CA}/node-template/label/nvidia.com/gpu.product"] == product  # scale from zero sees the same


def _mig_args(layout: dict[str, int], instance_types: tuple[str, ...] = ("p4de.24xlarge",)) -> nodepool.NodePoolArgs:
    return nodepool.NodePoolArgs(
        names=_names(), pool="notebooks", kind="gpu", cluster_name="c", ami_id="ami-0123456789abcdef0",
        instance_types=instance_types, subnet_ids={"us-west-2a": "s-a"}, vpc_id="vpc-1",
        cluster_dns=("169.254.20.10",), gpu_check=GpuCheck(dcgm_level=0, throughput=False),
        gpu_sharing=GpuSharing(mig=layout),
    )  # fmt: skip


def test_a_mig_pool_advertises_its_instances_and_writes_its_layout() -> None:
    """Scale from zero sees 8 GPUs' MIG instances and 0 whole GPUs; the node labels pick the device plugin's
    configuration and leave out the autoscaler's accelerator label (with it, a node that never offers nvidia.com/gpu
    would stay unready to the autoscaler); the user data writes the placed layout and applies it before the check."""
    args = _mig_args({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    tags = nodepool.autoscaler_tags(args)
    resources = {k.rsplit("/", 2)[-2] + "/" + k.rsplit("/", 1)[-1]: v for k, v in tags.items() if "/resources/" in k}
    assert resources == {
        "nvidia.com/gpu": "0",
        "nvidia.com/mig-1g.10gb": "16",
        "nvidia.com/mig-2g.20gb": "8",
        "nvidia.com/mig-3g.40gb": "8",
    }
    labels = nodepool.node_labels(args)
    assert labels["nvidia.com/device-plugin.config"] == "pool-notebooks"
    assert "k8s.amazonaws.com/accelerator" not in labels
    user_data = nodepool.render_user_data(
        pool="notebooks", cluster_name="c", region="us-west-2", labels=labels, taints=(), max_pods=737,
        cluster_dns=("169.254.20.10",), gpu_expectation=nodepool.gpu_expectation(args),
        mig_layout=nodepool.mig_layout(args),
    )  # fmt: skip
    assert f"printf '%s\\n' '14:0,19:2,19:3,9:4' >{gpu_sharing.MIG_LAYOUT_PATH}" in user_data
    assert user_data.index(f"systemctl start {gpu_sharing.MIG_UNIT}") < user_data.index(gpu_health.CHECK_UNIT)
    expect = json.loads(str(nodepool.gpu_expectation(args)))["instance_types"]["p4de.24xlarge"]
    assert expect["mig"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} and expect["gpu_count"] == 8


def test_a_mig_layout_the_gpu_cannot_hold_is_refused_by_the_args() -> None:
    with pytest.raises(ValueError, match=r"notebooks: gpu_sharing.mig: p4de.24xlarge: .*do not fit"):
        _mig_args({"3g.40gb": 2, "1g.10gb": 1})
    with pytest.raises(ValueError, match=r"g6.xlarge: NVIDIA L4 \(L4\) has no MIG"):
        _mig_args({"1g.10gb": 7}, ("g6.xlarge",))


def _names():  # type: ignore[no-untyped-def]
    from dlinfra.model.naming import Names

    return Names("dlinfra", "prod", "us-west-2")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "gpu", "instance_types": ["m7i.4xlarge"]}, "m7i.4xlarge has no GPU"),
        ({"kind": "cpu", "instance_types": ["g5.xlarge"]}, "is a GPU type in a CPU pool"),
        ({"kind": "gpu", "instance_types": ["g5.xlarge"], "efa": True}, "g5.xlarge does not support EFA"),
        (
            {
                "kind": "gpu",
                "instance_types": ["p5.48xlarge"],
                "efa": True,
                "subnet_ids": {"us-west-2a": "s-a", "us-west-2b": "s-b"},
            },
            "an EFA pool lives in one AZ",
        ),
        ({"min_size": 5, "max_size": 2}, "need 0 <= min <= max"),
        ({"instance_types": ["p9.mega"]}, "unknown instance type 'p9.mega'"),
        ({"kind": "gpu", "instance_types": ["g6.xlarge"], "spot": True}, "GPU pools run on demand"),
        ({"cluster_dns": ()}, "cluster_dns: at least one address"),
        ({"cluster_dns": ("169.254.20.10", "kube-dns")}, "cluster_dns: 'kube-dns' is not an IPv4 address"),
        ({"reservation_placement_group": "pg"}, "reservation_placement_group: only for a capacity reservation"),
        ({"checkpoint_grace": 7000}, "checkpoint_grace: 7000 s plus the 300 s drain margin"),
        (
            {"reservation_placement_group": "pg", "capacity_reservation_id": "cr-1", "capacity_block": True},
            "reservation_placement_group: only for a capacity reservation",
        ),
    ],
)
def test_bad_args(overrides: dict, message: str) -> None:
    base = {
        "names": _names(),
        "pool": "p",
        "kind": "cpu",
        "cluster_name": "c",
        "ami_id": "ami-0123456789abcdef0",
        "instance_types": ["m7i.4xlarge"],
        "subnet_ids": {"us-west-2a": "s-a"},
        "vpc_id": "vpc-1",
        "cluster_dns": ("169.254.20.10", "172.20.0.10"),
    }
    with pytest.raises(Exception, match=message) as info:
        nodepool.NodePoolArgs(**(base | overrides))
    assert "p" in str(info.value)


def test_missing_ami_names_the_pool_and_region(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    text = (ROOT / "images" / "manifest.example.json").read_text().replace("eu-west-1:ami-", "eu-north-1:ami-")
    manifest.write_text(text)
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    role = stackroles.StackRole("regional", "prod", "eu-west-1")
    config = CONFIG | {"dlinfra:images_manifest": str(manifest)}
    with pytest.raises(engine.EngineError) as info:
        engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={}, program=program)
    text = str(info.value)
    assert "environments.prod.node_pools." in text and "no AMI for variant" in text
    assert "in region eu-west-1" in text and str(manifest) in text


# The reference block's window and type: an on-demand reservation has no window (CapacityReservation._window).
BLOCK_WINDOW = re.compile(r"start: [^,]+, end: [^,]+, type: capacity_block}")


def test_pool_on_a_capacity_reservation_gets_no_placement_group(tmp_path: Path) -> None:
    """Not only Capacity Blocks: an ordinary reservation, made outside our placement group, never fits in it."""
    fleet = tmp_path / "fleet.yaml"
    text = REFERENCE_FLEET.read_text()
    assert "type: capacity_block}" in text
    fleet.write_text(BLOCK_WINDOW.sub("type: reservation}", text))
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    role = stackroles.StackRole("regional", "prod", "us-west-2")
    config = CONFIG | {"dlinfra:fleet": str(fleet)}
    result = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={}, program=program)
    (lt,) = [r for r in result.resources if r.name == "pool-train-h100-lt"]
    assert lt.inputs["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
    assert "instanceMarketOptions" not in lt.inputs and "placement" not in lt.inputs
    assert not [r for r in result.resources if r.type == "aws:ec2/placementGroup:PlacementGroup"]


def test_pool_on_a_reservation_made_in_a_cluster_placement_group_launches_into_that_group(tmp_path: Path) -> None:
    """AWS's way to reserve EFA capacity together (EC2 guide, "Capacity Reservations in cluster placement groups"):
    the instances must launch into the reservation's group ("Launch instances into an existing Capacity
    Reservation"), which the fleet names; dlinfra makes no group of its own."""
    fleet = tmp_path / "fleet.yaml"
    text = REFERENCE_FLEET.read_text()
    assert "type: capacity_block}" in text
    fleet.write_text(BLOCK_WINDOW.sub("type: reservation, placement_group: lab-h100-cpg}", text))
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    role = stackroles.StackRole("regional", "prod", "us-west-2")
    config = CONFIG | {"dlinfra:fleet": str(fleet)}
    result = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={}, program=program)
    (lt,) = [r for r in result.resources if r.name == "pool-train-h100-lt"]
    assert lt.inputs["placement"] == {"groupName": "lab-h100-cpg"}
    assert lt.inputs["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
    assert lt.inputs["tags"]["reservation-placement-group"] == "lab-h100-cpg"  # what the rule compares with
    assert not [r for r in result.resources if r.type == "aws:ec2/placementGroup:PlacementGroup"]


def _run_user_data(text: str, tmp_path: Path, *, image_has_check: bool) -> tuple[list[str], list[str], Path]:
    """The user data run by bash, as cloud-init would: systemctl and the join tool are stand-ins that record their
    calls; the expectation lands under tmp_path. Returns (the join's arguments, systemctl's calls, the expectation)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >>{calls}\nexit 0\n')
    unit = tmp_path / "units" / gpu_health.CHECK_UNIT  # the image's unit file (Chef writes it)
    if image_has_check:
        unit.parent.mkdir()
        unit.write_text("[Unit]\n")
    join = bin_dir / "dlinfra-node-join"
    join_args = tmp_path / "join.args"
    join.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done >{join_args}\n')
    for tool in (bin_dir / "systemctl", join):
        tool.chmod(0o755)
    expect = tmp_path / "etc" / "gpu-expect.json"
    script = tmp_path / "user-data.sh"
    script.write_text(
        text.replace("/usr/local/sbin/dlinfra-node-join", str(join))
        .replace(gpu_health.EXPECT_PATH, str(expect))
        .replace(f"/etc/systemd/system/{gpu_health.CHECK_UNIT}", str(unit))
    )
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    called = calls.read_text().splitlines() if calls.exists() else []
    return join_args.read_text().splitlines(), called, expect


@pytest.mark.parametrize("image_has_check", [True, False])
def test_gpu_user_data_burns_in_where_the_image_has_the_check(tmp_path: Path, image_has_check: bool) -> None:
    """With the check in the image: the expectation, the unit started, the burn-in taint. An image from before the
    burn-in: the node still joins, with the pool's taints only (the agent then marks it not checked)."""
    text = nodepool.render_user_data(
        pool="train-h100",
        cluster_name="dlinfra-prod-usw2-eks",
        region="us-west-2",
        labels={"dlinfra.io/pool": "train-h100"},
        taints=[("nvidia.com/gpu", "true", "NoSchedule")],
        max_pods=100,
        cluster_dns=("169.254.20.10",),
        gpu_expectation='{"instance_types":{"p5.48xlarge":{"gpu_count":8}}}',
    )
    join, systemctl, expect = _run_user_data(text, tmp_path, image_has_check=image_has_check)
    taints = join[join.index("--register-with-taints") + 1]
    if image_has_check:
        assert taints == "nvidia.com/gpu=true:NoSchedule,{}={}:{}".format(*gpu_health.BURN_IN_TAINT)
        assert systemctl == [f"start --no-block {gpu_health.CHECK_UNIT}"]
        assert json.loads(expect.read_text())["instance_types"]["p5.48xlarge"]["gpu_count"] == 8
    else:
        assert taints == "nvidia.com/gpu=true:NoSchedule"
        assert systemctl == [] and not expect.exists()


def test_cpu_user_data_joins_without_the_burn_in(tmp_path: Path) -> None:
    text = nodepool.render_user_data(
        pool="cpu", cluster_name="c", region="us-west-2", labels={"dlinfra.io/pool": "cpu"}, taints=[],
        max_pods=None, cluster_dns=("169.254.20.10",),
    )  # fmt: skip
    join, systemctl, _ = _run_user_data(text, tmp_path, image_has_check=True)
    assert join[join.index("--register-with-taints") + 1] == "" and systemctl == []


def test_user_data_over_ec2_s_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="over EC2's 16384"):
        nodepool.render_user_data(
            pool="p", cluster_name="c", region="r", labels={}, taints=[], max_pods=None, cluster_dns=("1.1.1.1",),
            gpu_expectation="x" * 17000,
        )  # fmt: skip


@pytest.mark.parametrize("stack", [s for s in reference.runs() if not s.endswith("-k8s") and s != "prod-global"])
def test_gpu_nodes_may_mark_only_their_own_group_s_instances_unhealthy(stack: str) -> None:
    """The GPU repair: a node the cluster approved marks its instance unhealthy, and its group replaces it. GPU pools
    only, and only in the pool's own group."""
    resources = reference.runs()[stack].resources
    groups = {r.inputs["name"]: r for r in resources if r.type == "aws:autoscaling/group:Group"}
    policies = [
        r for r in resources if r.type == "aws:iam/rolePolicy:RolePolicy" and r.inputs.get("name") == "gpu-repair"
    ]
    gpu_tags = {f"{CA}/node-template/resources/nvidia.com/gpu", gpu_sharing.SHARES_TAG}  # whole GPUs or shared
    gpu_groups = {name for name, g in groups.items() if any(t["key"] in gpu_tags for t in g.inputs["tags"])}
    assert len(policies) == len(gpu_groups) > 0
    granted = set()
    for policy in policies:
        (statement,) = json.loads(policy.inputs["policy"])["Statement"]
        assert statement["Action"] == "autoscaling:SetInstanceHealth" and statement["Effect"] == "Allow"
        granted.add(statement["Resource"].rsplit("/", 1)[1])
    assert granted == gpu_groups
