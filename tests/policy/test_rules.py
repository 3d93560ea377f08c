"""Every policy rule passes a good resource and flags a bad one, over small resource dicts (no PolicyPack)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from policy.dlinfra_policy import rules
from policy.dlinfra_policy.rules import Resource

STACK = "prod-us-west-2"
TAGS = {"project": "dlinfra", "environment": "prod", "region": "us-west-2", "component": "test", "managed-by": "x"}
GPU_TAG = rules.GPU_TEMPLATE_TAG
CA = rules.AUTOSCALER

PLAN = rules.AddressPlan(
    vpcs={STACK: ipaddress.IPv4Network("10.2.0.0/16"), "prod-us-east-1": ipaddress.IPv4Network("10.1.0.0/16")},
    vpc_keys={STACK: "vpc/prod/us-west-2", "prod-us-east-1": "vpc/prod/us-east-1"},
    blocks={
        "vpc/prod/us-west-2": ipaddress.IPv4Network("10.2.0.0/16"),
        "vpc/prod/us-east-1": ipaddress.IPv4Network("10.1.0.0/16"),
        "site-lan/sjc1": ipaddress.IPv4Network("10.200.0.0/20"),
    },
)
CTX = rules.Context(
    taggable=lambda t: t != "aws:ec2/route:Route",
    gpu_count=lambda t: {"p5.48xlarge": 8, "g6.xlarge": 1, "m7i.4xlarge": 0}.get(t),
    address_plan=PLAN,
    today=datetime.date(2026, 11, 22),
)


MAINTENANCE = "aws-node-termination-handler/scheduled-maintenance"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
JOB = "kubernetes:batch/v1:Job"

PROVIDER = f"urn:pulumi:{STACK}::dlinfra::pulumi:providers:aws::aws-us-west-2"
DEFAULT_PROVIDER = f"urn:pulumi:{STACK}::dlinfra::pulumi:providers:aws::default_7_12_0"


def res(type_: str, name: str = "r", stack: str = STACK, **options: Any) -> Callable[..., Resource]:
    """A resource factory: res(TYPE)(inputs...) with URN, protect, dependencies, id and provider from options
    (by default the stack's explicit us-west-2 provider)."""

    def make(**inputs: Any) -> Resource:
        return Resource(
            urn=f"urn:pulumi:{stack}::dlinfra::dlinfra:test:T${type_}::{name}",
            type=type_,
            name=name,
            inputs=inputs,
            protect=options.get("protect", False),
            dependencies=tuple(options.get("dependencies", ())),
            id=options.get("id", ""),
            provider_urn=options.get("provider_urn", PROVIDER),
            provider_inputs=options.get("provider_inputs", {"region": "us-west-2"}),
        )

    return make


def messages(rule_name: str, resources: Sequence[Resource], ctx: rules.Context = CTX) -> list[str]:
    """What a rule says about resources (a resource rule sees each, a stack rule all of them)."""
    rule = next(r for r in rules.RULES if r.name == rule_name)
    if isinstance(rule, rules.ResourceRule):
        return [m for r in resources for m in rule.check(r, ctx)]
    return [v.message for v in rule.check(resources, ctx)]


WORLD_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["0.0.0.0/0"]}
LAN_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["10.200.0.0/20"]}
STRONG_VPN = {
    f"tunnel{t}{key}": value
    for t in (1, 2)
    for key, value in {
        "IkeVersions": ["ikev2"],
        "Phase1EncryptionAlgorithms": ["AES256-GCM-16", "AES256"],
        "Phase2EncryptionAlgorithms": ["AES256-GCM-16"],
        "Phase1IntegrityAlgorithms": ["SHA2-384", "SHA2-256"],
        "Phase2IntegrityAlgorithms": ["SHA2-256"],
        "Phase1DhGroupNumbers": [20.0, 19.0, 14.0],
        "Phase2DhGroupNumbers": [20.0],
    }.items()
}
BUCKET = res("aws:s3/bucket:Bucket", "data", id="dlinfra-data")(bucket="dlinfra-data")
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
KMS_RULE = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]
PAB_ALL = dict.fromkeys(rules.S3_BLOCK_FLAGS, True)
VPC = "aws:ec2/vpc:Vpc"
ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
GPU_TAGS = [
    {"key": f"{CA}/enabled", "value": "true", "propagateAtLaunch": False},
    {"key": f"{CA}/dlinfra-prod-usw2", "value": "owned", "propagateAtLaunch": False},
    {"key": GPU_TAG, "value": "8", "propagateAtLaunch": False},
]
LT_GPU = res(LT, "gpu-lt", id="lt-1")(instanceType="p5.48xlarge")
SIGNED = "tls:index/locallySignedCert:LocallySignedCert"
OWNED = "kubernetes.io/cluster/dlinfra-prod-usw2"
TEAM_NS = {rules.TEAM_LABEL: "a", "pod-security.kubernetes.io/warn": "restricted"}
REFRESH = {"strategy": "Rolling", "preferences": {"minHealthyPercentage": 90.0, "skipMatching": True}}
CPU_MIX = {"launchTemplate": {"overrides": [{"instanceType": "m7i.4xlarge"}]}}
ENCRYPTED_ROOT = [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeType": "gp3"}}]


LOG_BUCKET = res("aws:s3/bucket:Bucket", "logs", id="dlinfra-logs")(bucket="dlinfra-logs")
TLS_ONLY = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*"}]}
LOG_POLICY = {
    "Statement": [
        *TLS_ONLY["Statement"],
        {
            "Effect": "Allow",
            "Principal": {"Service": "logging.s3.amazonaws.com"},
            "Action": "s3:PutObject",
            "Condition": {"StringEquals": {"aws:SourceAccount": "111122223333"}},
        },
    ]
}


def _trust(service: str, *, scoped: bool) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    if scoped:
        statement["Condition"] = {
            "StringEquals": {"aws:SourceAccount": "111122223333"},
            "ArnEquals": {"aws:SourceArn": "arn:aws:ssm:us-west-2:111122223333:*"},
        }
    return {"Version": "2012-10-17", "Statement": [statement]}


# rule -> (resources that pass, resources that fail); every rule in rules.RULES must be here.
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "ebs-encrypted": (
        [res(LT)(blockDeviceMappings=ENCRYPTED_ROOT), res("aws:ebs/volume:Volume")(encrypted=True)],
        [res(LT)(blockDeviceMappings=[{"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}}])],
    ),
    "efs-encrypted": (
        [res("aws:efs/fileSystem:FileSystem")(encrypted=True)],
        [res("aws:efs/fileSystem:FileSystem")(encrypted=False)],
    ),
    "s3-encrypted": (
        [BUCKET, res(SSE, dependencies=[BUCKET.urn])(bucket="dlinfra-data", rules=KMS_RULE)],
        [BUCKET],
    ),
    "fsx-encrypted": (
        [res(rules.FSX_LUSTRE)(deploymentType="PERSISTENT_2", kmsKeyId="arn:aws:kms:k"), res(rules.FSX_LUSTRE)()],
        [res(rules.FSX_LUSTRE)(deploymentType="PERSISTENT_2")],
    ),
    "eks-secrets-encrypted": (
        [res(rules.EKS_CLUSTER)(encryptionConfig={"resources": ["secrets"], "provider": {"keyArn": "arn:k"}})],
        [res(rules.EKS_CLUSTER)(name="c")],
    ),
    "s3-no-public-access": (
        [BUCKET, res(rules.S3_PUBLIC_ACCESS_BLOCK, dependencies=[BUCKET.urn])(bucket="dlinfra-data", **PAB_ALL)],
        [BUCKET, res(rules.S3_PUBLIC_ACCESS_BLOCK)(bucket="dlinfra-data", **PAB_ALL | {"blockPublicPolicy": False})],
    ),
    "imdsv2-required": (
        [res(LT)(metadataOptions={"httpTokens": "required", "httpPutResponseHopLimit": 1.0})],
        [res(LT)(metadataOptions={"httpTokens": "optional"})],
    ),
    "no-world-ingress": (
        [res(rules.SECURITY_GROUP)(ingress=[LAN_22], tags=TAGS)],
        [res(rules.SECURITY_GROUP)(ingress=[WORLD_22], tags=TAGS)],
    ),
    "vpc-cidr-planned": (
        [res(VPC)(cidrBlock="10.2.0.0/16")],
        [res(VPC)(cidrBlock="10.3.0.0/16")],
    ),
    "stateful-protected": (
        [res("aws:efs/fileSystem:FileSystem", protect=True)(encrypted=True)],
        [res("aws:efs/fileSystem:FileSystem")(encrypted=True)],
    ),
    "protect-only-stateful": (
        [res("aws:efs/fileSystem:FileSystem", protect=True)(encrypted=True), res("aws:eks/accessEntry:AccessEntry")()],
        [
            res("aws:eks/accessEntry:AccessEntry", protect=True)(),
            res("aws:efs/mountTarget:MountTarget", protect=True)(),
        ],
    ),
    "required-tags": (
        [res(VPC)(tags=TAGS), res("aws:ec2/route:Route")()],
        [res(VPC)(tags={"project": "dlinfra"})],
    ),
    "gpu-pool-scale-from-zero": (
        [LT_GPU, res(ASG, dependencies=[LT_GPU.urn])(minSize=0.0, launchTemplate={"id": "lt-1"}, tags=GPU_TAGS)],
        [LT_GPU, res(ASG, dependencies=[LT_GPU.urn])(minSize=0.0, launchTemplate={"id": "lt-1"}, tags=GPU_TAGS[:2])],
    ),
    "gpu-pools-no-auto-refresh": (
        [
            LT_GPU,
            res(ASG, dependencies=[LT_GPU.urn])(launchTemplate={"id": "lt-1"}, suspendedProcesses=["AZRebalance"]),
            res(ASG, "cpu")(mixedInstancesPolicy=CPU_MIX, instanceRefresh=REFRESH),
        ],
        [
            LT_GPU,
            res(ASG, dependencies=[LT_GPU.urn])(
                launchTemplate={"id": "lt-1"}, suspendedProcesses=["AZRebalance"], instanceRefresh=REFRESH
            ),
        ],
    ),
    "team-namespaces-pod-security": (
        [
            res(rules.K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS | {rules.PSA_ENFORCE: "baseline"}}),
            res(rules.K8S_NAMESPACE)(metadata={"name": "kube-system"}),
        ],
        [res(rules.K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS | {rules.PSA_ENFORCE: "privileged"}})],
    ),
    "drain-taints-not-tolerated": (
        [
            res(rules.RESOURCE_FLAVOR)(spec={"nodeLabels": {"dlinfra.io/pool": "train"}, "nodeTaints": [GPU_TAINT]}),
            res(rules.RESOURCE_FLAVOR)(spec={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}),
            res(JOB)(spec={"template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}}),
            # DaemonSets belong on every node, and drains leave them alone.
            res("kubernetes:apps/v1:DaemonSet")(spec={"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}),
        ],
        [
            res(rules.RESOURCE_FLAVOR)(spec={"tolerations": [{"operator": "Exists"}]}),
            res(rules.RESOURCE_FLAVOR)(spec={"nodeTaints": [{"key": MAINTENANCE, "effect": "NoSchedule"}]}),
            res(JOB)(spec={"template": {"spec": {"tolerations": [{"key": MAINTENANCE, "operator": "Exists"}]}}}),
            res("kubernetes:batch/v1:CronJob")(
                spec={"jobTemplate": {"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}}}
            ),
        ],
    ),
    "vpn-strong-crypto": (
        [res(rules.VPN_CONNECTION)(**STRONG_VPN)],
        [res(rules.VPN_CONNECTION)(**STRONG_VPN | {"tunnel2IkeVersions": ["ikev1", "ikev2"]})],
    ),
    "vpc-flow-logs": (
        [
            res(VPC, id="vpc-1")(cidrBlock="10.2.0.0/16"),
            res(rules.FLOW_LOG)(vpcId="vpc-1", trafficType="ALL"),
        ],
        [res(VPC, id="vpc-1")(cidrBlock="10.2.0.0/16")],
    ),
    "client-vpn-connection-logs": (
        [res(rules.CLIENT_VPN_ENDPOINT)(connectionLogOptions={"enabled": True})],
        [res(rules.CLIENT_VPN_ENDPOINT)(connectionLogOptions={"enabled": False})],
    ),
    "sg-no-inline-rules": (
        [res(rules.SECURITY_GROUP)(tags=TAGS), res(rules.SECURITY_GROUP)(ingress=[], egress=[])],
        [res(rules.SECURITY_GROUP)(ingress=[LAN_22]), res(rules.SECURITY_GROUP)(egress=[LAN_22])],
    ),
    "nodes-cluster-owned-tag": (
        [res(ASG)(tags=[*GPU_TAGS, {"key": OWNED, "value": "owned", "propagateAtLaunch": True}])],
        [
            res(ASG)(tags=GPU_TAGS),
            res(ASG)(tags=[*GPU_TAGS, {"key": OWNED, "value": "owned", "propagateAtLaunch": False}]),
        ],
    ),
    "s3-access-logs-delivered": (
        [
            LOG_BUCKET,
            BUCKET,
            res("aws:s3/bucketLogging:BucketLogging")(bucket="dlinfra-data", targetBucket="dlinfra-logs"),
            res(rules.S3_POLICY, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", policy=json.dumps(LOG_POLICY)),
            res(SSE, dependencies=[LOG_BUCKET.urn])(
                bucket="dlinfra-logs", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]
            ),
        ],
        [
            LOG_BUCKET,
            res("aws:s3/bucketLogging:BucketLogging")(bucket="dlinfra-data", targetBucket="dlinfra-logs"),
            res(rules.S3_POLICY, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", policy=json.dumps(TLS_ONLY)),
            res(SSE, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", rules=KMS_RULE),
        ],
    ),
    "eks-version-supported": (
        [res(rules.EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "EXTENDED"})],
        [
            res(rules.EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "STANDARD"}),  # ended 2026-07-29
            res(rules.EKS_CLUSTER)(version="1.33"),
        ],
    ),
    "eks-version-support-ending": (
        [
            res(rules.EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "EXTENDED"}),  # to 2027-07-29
            res(rules.EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "STANDARD"}),  # past: mandatory's
        ],
        [res(rules.EKS_CLUSTER)(version="1.34", upgradePolicy={"supportType": "STANDARD"})],  # ends 2026-12-02
    ),
    "service-trust-scoped": (
        [
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ssm.amazonaws.com", scoped=True))),
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ec2.amazonaws.com", scoped=False))),
        ],
        [
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ssm.amazonaws.com", scoped=False))),
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("codebuild.amazonaws.com", scoped=False))),
        ],
    ),
    "server-cert-domain-san": (
        [
            CSR_WITH_DOMAIN := res(rules.TLS_CERT_REQUEST, "server-csr")(dnsNames=["vpn-server.clientvpn.internal"]),
            res(SIGNED, dependencies=[CSR_WITH_DOMAIN.urn])(allowedUses=["key_encipherment", "server_auth"]),
            res(SIGNED, "client")(allowedUses=["client_auth"]),  # client certificates need no domain
        ],
        [
            CSR_BARE := res(rules.TLS_CERT_REQUEST, "server-csr")(subject={"commonName": "vpn-server"}),
            res(SIGNED, dependencies=[CSR_BARE.urn])(allowedUses=["server_auth"]),
            res(rules.TLS_SIGNED_CERTS[1])(allowedUses=["server_auth"], dnsNames=["server"]),
        ],
    ),
    "client-vpn-revocable": (
        [
            res(rules.CLIENT_VPN_ENDPOINT)(authenticationOptions=[{"type": "federated-authentication"}]),
            res(rules.CLIENT_VPN_ENDPOINT)(
                authenticationOptions=[{"type": "certificate-authentication"}],
                clientConnectOptions={"enabled": True, "lambdaFunctionArn": "arn:aws:lambda:x"},
            ),
        ],
        [res(rules.CLIENT_VPN_ENDPOINT)(authenticationOptions=[{"type": "certificate-authentication"}])],
    ),
    "multikueue-wired": (
        [
            res(f"{rules.KUEUE_CUSTOM}AdmissionCheck", "c")(
                metadata={"name": "c"},
                spec={
                    "controllerName": rules.MULTIKUEUE_CONTROLLER,
                    "parameters": {"kind": "MultiKueueConfig", "name": "c"},
                },
            ),
            res(f"{rules.KUEUE_CUSTOM}MultiKueueConfig", "k")(metadata={"name": "c"}, spec={"clusters": ["w"]}),
            res(f"{rules.KUEUE_CUSTOM}MultiKueueCluster", "w")(
                metadata={"name": "w"},
                spec={"clusterSource": {"kubeConfig": {"location": "s", "locationType": "Secret"}}},
            ),
        ],
        [
            res(f"{rules.KUEUE_CUSTOM}AdmissionCheck", "c")(
                metadata={"name": "c"},
                spec={
                    "controllerName": rules.MULTIKUEUE_CONTROLLER,
                    "parameters": {"kind": "MultiKueueConfig", "name": "c"},
                },
            ),
        ],
    ),
    "explicit-provider": (
        [
            res(VPC)(cidrBlock="10.2.0.0/16"),
            # Global stacks have one explicit provider per region; no region is implied by their name.
            res(VPC, stack="prod-global", provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16"),
            res(
                "kubernetes:core/v1:Namespace",
                stack=f"{STACK}-k8s",
                provider_urn="urn:x::pulumi:providers:kubernetes::k8s",
            )(),
            res("tls:index/privateKey:PrivateKey", provider_urn="")(algorithm="RSA"),
        ],
        [
            res(VPC, provider_urn=DEFAULT_PROVIDER)(cidrBlock="10.2.0.0/16"),
            res(VPC, provider_urn="")(cidrBlock="10.2.0.0/16"),
            res(VPC, provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16"),
            res("kubernetes:core/v1:Namespace", stack=f"{STACK}-k8s", provider_urn="")(),
        ],
    ),
}


def test_every_rule_has_cases() -> None:
    assert sorted(CASES) == sorted(r.name for r in rules.RULES)
    assert len({r.name for r in rules.RULES}) == len(rules.RULES)


@pytest.mark.parametrize("rule_name", sorted(CASES))
def test_rule_passes_good_resources(rule_name: str) -> None:
    assert messages(rule_name, CASES[rule_name][0]) == []


@pytest.mark.parametrize("rule_name", sorted(CASES))
def test_rule_flags_bad_resources(rule_name: str) -> None:
    assert messages(rule_name, CASES[rule_name][1]), f"{rule_name} let a bad resource through"


def test_rules_ignore_other_types() -> None:
    vpc = res(VPC)(cidrBlock="10.2.0.0/16", tags=TAGS)
    assert [m for r in rules.RULES if isinstance(r, rules.ResourceRule) for m in r.check(vpc, CTX)] == []


# --- details that matter ------------------------------------------------------------------------------------


def test_ebs_launch_template_without_block_devices_is_flagged() -> None:
    assert "no EBS block device" in rules.ebs_encrypted(res(LT)(imageId="ami-1"), CTX)[0]


def test_ebs_instance_root_volume() -> None:
    bad = res(rules.INSTANCE)(rootBlockDevice={"encrypted": False}, ebsBlockDevices=[{"encrypted": True}])
    assert rules.ebs_encrypted(bad, CTX) == ["rootBlockDevice is not encrypted: set rootBlockDevice.encrypted=true"]


def test_s3_bucket_matched_by_name_without_dependency() -> None:
    sse = res(SSE)(bucket="dlinfra-data", rules=KMS_RULE)
    assert rules.s3_encrypted([BUCKET, sse], CTX) == []


def test_s3_weak_algorithm() -> None:
    sse = res(SSE)(bucket="dlinfra-data", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "none"}}])
    assert "sseAlgorithm 'none'" in rules.s3_encrypted([BUCKET, sse], CTX)[0].message


def test_s3_public_acl_and_account_block() -> None:
    account = res(rules.S3_ACCOUNT_PUBLIC_ACCESS_BLOCK)(**PAB_ALL)
    public = res("aws:s3/bucket:Bucket", "web")(bucket="web", acl="public-read")
    found = rules.s3_no_public_access([account, public], CTX)
    assert [v.message for v in found] == ["S3 bucket has the public ACL 'public-read'"]


def test_imdsv2_disabled_endpoint_is_fine_and_unset_is_not() -> None:
    assert rules.imdsv2_required(res(LT)(metadataOptions={"httpEndpoint": "disabled"}), CTX) == []
    assert "unset" in rules.imdsv2_required(res(rules.INSTANCE)(ami="ami-1"), CTX)[0]


@pytest.mark.parametrize(
    ("resource", "hits"),
    [
        (res(rules.SECURITY_GROUP_INGRESS_RULE)(cidrIpv6="::/0", ipProtocol="tcp", fromPort=443, toPort=443), 1),
        (res(rules.SECURITY_GROUP_INGRESS_RULE)(cidrIpv4="10.0.0.0/8", ipProtocol="-1"), 0),
        (res(rules.SECURITY_GROUP_RULE)(type="ingress", cidrBlocks=["0.0.0.0/1", "128.0.0.0/1"], protocol="-1"), 2),
        (res(rules.SECURITY_GROUP_RULE)(type="egress", cidrBlocks=["0.0.0.0/0"], protocol="-1"), 0),
        (res(rules.SECURITY_GROUP)(egress=[{"cidrBlocks": ["0.0.0.0/0"], "protocol": "-1"}]), 0),
    ],
)
def test_world_ingress_variants(resource: Resource, hits: int) -> None:
    assert len(rules.no_world_ingress(resource, CTX)) == hits


def test_world_ingress_allowlist_needs_component_protocol_and_ports() -> None:
    entry = rules.IngressException("edge", "udp", 443, 443, "a public UDP service the design declares")
    ctx = rules.Context(taggable=CTX.taggable, gpu_count=CTX.gpu_count, ingress_allowlist=(entry,))
    rule = {"cidrIpv4": "0.0.0.0/0", "ipProtocol": "udp", "fromPort": 443.0, "toPort": 443.0}
    assert (
        rules.no_world_ingress(res(rules.SECURITY_GROUP_INGRESS_RULE)(**rule, tags=TAGS | {"component": "edge"}), ctx)
        == []
    )
    assert rules.no_world_ingress(res(rules.SECURITY_GROUP_INGRESS_RULE)(**rule, tags=TAGS), ctx)
    assert rules.no_world_ingress(
        res(rules.SECURITY_GROUP_INGRESS_RULE)(**rule | {"ipProtocol": "tcp"}, tags=TAGS | {"component": "edge"}), ctx
    )


def test_design_allowlist_is_documented() -> None:
    assert all(len(e.reason) > 20 for e in rules.INGRESS_ALLOWLIST)


def test_vpc_overlapping_a_site_lan_and_another_vpc() -> None:
    ours = res(VPC, "a")(cidrBlock="10.200.0.0/16")
    found = [v.message for v in rules.vpc_cidrs_planned([ours], CTX)]
    assert any("not the planned block 10.2.0.0/16" in m for m in found)
    assert any("overlaps site-lan/sjc1" in m for m in found)
    east = res(VPC, "b", stack="prod-us-east-1")(cidrBlock="10.1.0.0/16")
    clash = res(VPC, "c", stack="staging-us-west-2")(cidrBlock="10.1.128.0/17")
    across = rules.vpcs_disjoint([east, clash], across_stacks_only=True)
    assert [v.urn for v in across] == [clash.urn]


def test_vpc_without_plan_is_a_violation_not_a_pass() -> None:
    ctx = rules.Context(taggable=CTX.taggable, gpu_count=CTX.gpu_count, address_plan_error="lock missing")
    assert "lock missing" in rules.vpc_cidrs_planned([res(VPC)(cidrBlock="10.2.0.0/16")], ctx)[0].message
    assert (
        "has no VPC in the address plan"
        in rules.vpc_cidrs_planned([res(VPC, stack="x-y")(cidrBlock="10.9.0.0/16")], CTX)[0].message
    )


def test_required_tags_read_autoscaling_group_tag_lists() -> None:
    group = res(ASG)(tags=[{"key": k, "value": v, "propagateAtLaunch": True} for k, v in TAGS.items()])
    assert rules.required_tags(group, CTX) == []
    assert rules.required_tags(res("random:index/randomPassword:RandomPassword")(length=32.0), CTX) == []


def test_gpu_pool_detected_by_instance_type_and_count_checked() -> None:
    overrides = {"launchTemplate": {"overrides": [{"instanceType": "g6.xlarge"}]}}
    wrong = [*GPU_TAGS[:2], {"key": GPU_TAG, "value": "8"}]
    found = rules.gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=overrides, tags=wrong)], CTX)
    assert [v.message for v in found] == [f"tag {GPU_TAG}=8 but g6.xlarge has 1 GPUs"]
    undiscoverable = rules.gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=overrides, tags=[])], CTX)
    assert len(undiscoverable) == 3
    cpu = {"launchTemplate": {"overrides": [{"instanceType": "m7i.4xlarge"}]}}
    assert rules.gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=cpu, tags=[])], CTX) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tunnel1Phase1DhGroupNumbers": [2.0, 14.0]}, "tunnel1Phase1DhGroupNumbers allows [2]"),
        ({"tunnel1Phase2DhGroupNumbers": [22.0]}, "tunnel1Phase2DhGroupNumbers allows [22]"),
        ({"tunnel2Phase1EncryptionAlgorithms": ["AES128"]}, "allows ['AES128']"),
        ({"tunnel1Phase2IntegrityAlgorithms": ["SHA1"]}, "allows ['SHA1']"),
        ({"tunnel2Phase2IntegrityAlgorithms": None}, "is unset"),
        ({"tunnel1IkeVersions": None}, "ikev1 too"),
    ],
)
def test_vpn_weak_proposals(change: dict[str, Any], expected: str) -> None:
    found = rules.vpn_strong_crypto(res(rules.VPN_CONNECTION)(**STRONG_VPN | change), CTX)
    assert len(found) == 1 and expected in found[0]


def test_stateful_list_names_its_types() -> None:
    assert {"aws:efs/fileSystem:FileSystem", "aws:s3/bucket:Bucket", "aws:kms/key:Key"} <= set(rules.STATEFUL_TYPES)


def test_explicit_provider_names_the_problem() -> None:
    wrong_region = res(VPC, provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16")
    assert messages("explicit-provider", [wrong_region]) == [
        "provider region is 'eu-west-1', but the stack prod-us-west-2 is in us-west-2"
    ]
    default = res(VPC, provider_urn=DEFAULT_PROVIDER)(cidrBlock="10.2.0.0/16")
    assert messages("explicit-provider", [default]) == [
        "uses the default aws provider: pass the stack's explicit provider"
    ]
    each_bad = CASES["explicit-provider"][1]
    assert all(messages("explicit-provider", [r]) for r in each_bad)


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({"suspendedProcesses": ["AZRebalance"]}, []),
        ({"suspendedProcesses": ["AZRebalance"], "maxInstanceLifetime": 604800.0}, ["maxInstanceLifetime=604800s"]),
        ({}, ["AZRebalance is not suspended"]),
        ({"suspendedProcesses": ["AZRebalance"], "instanceRefresh": REFRESH}, ["instanceRefresh is set"]),
    ],
)
def test_gpu_pools_no_auto_refresh_details(inputs: dict[str, Any], expected: list[str]) -> None:
    # Found as a GPU pool by its scale-from-zero tag alone (a template not in the stack, e.g. during preview).
    group = res(ASG)(launchTemplate={"id": "lt-elsewhere"}, tags=GPU_TAGS, **inputs)
    found = [v.message for v in rules.gpu_pools_no_auto_refresh([group], CTX)]
    assert len(found) == len(expected) and all(e in m for e, m in zip(expected, found, strict=True))
    # CPU pools may refresh automatically.
    cpu = res(ASG)(mixedInstancesPolicy=CPU_MIX, instanceRefresh=REFRESH, maxInstanceLifetime=604800.0)
    assert rules.gpu_pools_no_auto_refresh([cpu], CTX) == []


def test_team_namespace_without_an_enforced_level_is_flagged() -> None:
    unset = res(rules.K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS})
    (message,) = rules.team_namespaces_pod_security(unset, CTX)
    assert "unset, which admits privileged pods" in message
    restricted = res(rules.K8S_NAMESPACE)(metadata={"labels": TEAM_NS | {rules.PSA_ENFORCE: "restricted"}})
    assert rules.team_namespaces_pod_security(restricted, CTX) == []


def _kueue(kind: str, name: str, spec: dict[str, Any]) -> Resource:
    return res(f"{rules.KUEUE_CUSTOM}{kind}", name)(metadata={"name": name}, spec=spec)


def test_multikueue_wiring_is_checked() -> None:
    from components.charts import multikueue

    check = _kueue("AdmissionCheck", "overflow-a", multikueue.overflow_admission_check_spec("a"))
    config = _kueue("MultiKueueConfig", "overflow-a", multikueue.multikueue_config_spec(["us-east-1"]))
    cluster = _kueue("MultiKueueCluster", "us-east-1", multikueue.multikueue_cluster_spec("us-east-1"))
    queue_spec = multikueue.overflow_cluster_queue_spec("a", "team-a", 8)
    queue = _kueue("ClusterQueue", "a-overflow", queue_spec)
    assert rules.multikueue_wired([check, config, cluster, queue], CTX) == []
    per_flavor = _kueue(
        "ClusterQueue",
        "a-overflow",
        queue_spec | {"admissionChecksStrategy": {"admissionChecks": [{"name": "overflow-a", "onFlavors": ["x"]}]}},
    )
    (found,) = rules.multikueue_wired([check, config, cluster, per_flavor], CTX)
    assert "limited to some flavors" in found.message
    (orphan,) = rules.multikueue_wired([check, config, queue], CTX)
    assert orphan.message == "MultiKueueConfig overflow-a: no MultiKueueCluster us-east-1"
    path = _kueue(
        "MultiKueueCluster", "us-east-1", {"clusterSource": {"kubeConfig": {"location": "/x", "locationType": "Path"}}}
    )
    (by_path,) = rules.multikueue_wired([check, config, path, queue], CTX)
    assert "not a Secret" in by_path.message
    assert rules.MULTIKUEUE_CONTROLLER == multikueue.MULTIKUEUE_CONTROLLER


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),  # the handler's taints are NoSchedule
        ({"key": MAINTENANCE, "operator": "Exists"}, True),
        ({"key": MAINTENANCE, "operator": "Equal", "value": "x"}, True),  # the value is the event id: any may match
        ({"key": "aws-node-termination-handler/spot-itn", "operator": "Exists"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
        ({"key": "", "operator": "Equal"}, False),
    ],
)
def test_toleration_matching_follows_kubernetes(toleration: dict[str, Any], tolerated: bool) -> None:
    assert rules.tolerates(toleration, MAINTENANCE) is tolerated


def test_a_blanket_toleration_is_reported_for_every_drain_taint() -> None:
    flavor = res(rules.RESOURCE_FLAVOR)(spec={"tolerations": [{"operator": "Exists"}]})
    found = rules.drain_taints_not_tolerated(flavor, CTX)
    assert len(found) == len(rules.DRAIN_TAINT_KEYS)
    assert any(MAINTENANCE in m and "every admitted pod" in m for m in found)
    assert any("node.kubernetes.io/unschedulable" in m for m in found)  # the cordon itself


def test_drain_taint_keys_are_the_handlers() -> None:
    """The pinned handler's taint keys, copied from aws-node-termination-handler v1.25.6 pkg/node/node.go."""
    assert set(rules.DRAIN_TAINT_KEYS) == {
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "aws-node-termination-handler/rebalance-recommendation",
        "node.kubernetes.io/unschedulable",
    }


def test_policy_team_label_is_the_platforms() -> None:
    from components.charts import kueue

    assert rules.TEAM_LABEL == kueue.TEAM_LABEL


@pytest.mark.parametrize(
    ("today", "advisory", "mandatory"),
    [
        (datetime.date(2026, 9, 2), [], []),  # 91 days before standard support ends
        (datetime.date(2026, 9, 3), ["(90 days)"], []),
        (datetime.date(2026, 12, 2), ["(0 days)"], []),  # the last day of standard support
        (datetime.date(2026, 12, 3), [], ["left standard support on 2026-12-02"]),
    ],
)
def test_eks_version_warns_then_refuses(today: datetime.date, advisory: list[str], mandatory: list[str]) -> None:
    """The advisory warns through the last day of support; from the next day the mandatory rule refuses."""
    cluster = res(rules.EKS_CLUSTER)(version="1.34", upgradePolicy={"supportType": "STANDARD"})
    ctx = dataclasses.replace(CTX, today=today)
    for rule, expected in (("eks-version-support-ending", advisory), ("eks-version-supported", mandatory)):
        found = messages(rule, [cluster], ctx)
        assert len(found) == len(expected) and all(e in m for e, m in zip(expected, found, strict=True)), (rule, found)


def test_protect_only_stateful_accepts_a_costly_type_with_a_reason() -> None:
    """What holds no data may still be protected on purpose, but only when COSTLY_TO_LOSE says why."""
    ca_key = res("tls:index/privateKey:PrivateKey", protect=True)(algorithm="RSA")
    assert messages("protect-only-stateful", [ca_key]) != []
    costly = dataclasses.replace(CTX, costly_to_lose={ca_key.type: "a new CA invalidates every laptop profile"})
    assert messages("protect-only-stateful", [ca_key], costly) == []
    for type_, reason in rules.COSTLY_TO_LOSE.items():
        assert reason.strip() and type_ not in rules.STATEFUL_TYPES, type_
