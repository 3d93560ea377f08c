"""The rules as CrossGuard policies, driven through the policy SDK's analyzer as the Pulumi CLI drives it.

The analyzer servicer is what PolicyPack serves over gRPC; calling it directly runs the SDK's own
deserialisation (unknown values, proxies, options) without starting a server (PolicyPack never returns).
"""

from __future__ import annotations

import ast
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel, policy

from policy.dlinfra_policy import pack
from policy.dlinfra_policy.rules.catalog import RULES
from policy.dlinfra_policy.rules.compute import GPU_TEMPLATE_TAG
from policy.dlinfra_policy.rules.core import AddressPlan, Context
from policy.dlinfra_policy.rules.storage import S3_BLOCK_FLAGS
from tests.conftest import ROOT

CTX = Context(
    taggable=lambda t: True,
    gpu_count=lambda t: None,
    address_plan=AddressPlan(
        vpcs={"prod-us-west-2": ipaddress.IPv4Network("10.2.0.0/16")},
        vpc_keys={"prod-us-west-2": "vpc/prod/us-west-2"},
        blocks={"vpc/prod/us-west-2": ipaddress.IPv4Network("10.2.0.0/16")},
    ),
)
URN = "urn:pulumi:prod-us-west-2::dlinfra::dlinfra:test:T${type}::{name}"
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's marker for a value known only after apply


@pytest.fixture(scope="module")
def analyzer() -> Any:
    return policy._PolicyAnalyzerServicer(
        pack.PACK_NAME,
        "0.1.0",
        pack.policies(CTX),
        EnforcementLevel.MANDATORY,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )


def _request(
    kind: Any, type_: str, name: str, props: dict[str, Any], protect: bool = False, region: str | None = "us-west-2"
) -> Any:
    """An analyzer request; with a region, the resource goes through an explicit AWS provider in that region."""
    request = kind(type=type_, urn=URN.format(type=type_, name=name), name=name)
    json_format.ParseDict(props, request.properties)
    request.options.protect = protect
    if region is not None:
        request.provider.type = "pulumi:providers:aws"
        request.provider.name = f"aws-{region}"
        request.provider.urn = f"urn:pulumi:prod-us-west-2::dlinfra::pulumi:providers:aws::aws-{region}"
        json_format.ParseDict({"region": region}, request.provider.properties)
    return request


def _violations(response: Any) -> list[tuple[str, str, str]]:
    return [(d.policyName, d.message, d.urn) for d in response.diagnostics]


def test_one_policy_per_rule_with_its_level() -> None:
    policies = pack.policies(CTX)
    assert [p.name for p in policies] == [r.name for r in RULES]
    levels = {p.name: p.enforcement_level for p in policies}
    assert levels["ebs-encrypted"] == EnforcementLevel.MANDATORY
    assert levels["vpc-flow-logs"] == EnforcementLevel.ADVISORY
    kinds = {p.name: type(p).__name__ for p in policies}
    assert kinds["s3-encrypted"] == "StackValidationPolicy" and kinds["imdsv2-required"] == "ResourceValidationPolicy"


def test_resource_policy_reports_through_the_analyzer(analyzer: Any) -> None:
    efs = _request(proto.AnalyzeRequest, "aws:efs/fileSystem:FileSystem", "home", {"encrypted": False})
    found = _violations(analyzer.Analyze(efs, None))
    assert {name for name, _, _ in found} == {"efs-encrypted", "stateful-protected", "required-tags"}
    protected = _request(
        proto.AnalyzeRequest, "aws:efs/fileSystem:FileSystem", "home", {"encrypted": True}, protect=True
    )
    assert {name for name, _, _ in _violations(analyzer.Analyze(protected, None))} == {"required-tags"}


def test_provider_reaches_the_explicit_provider_rule(analyzer: Any) -> None:
    def provider_findings(region: str | None) -> list[str]:
        vpc = _request(proto.AnalyzeRequest, "aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": "10.2.0.0/16"}, region=region)
        found = _violations(analyzer.Analyze(vpc, None))
        return [m.splitlines()[-1] for name, m, _ in found if name == "explicit-provider"]

    assert provider_findings("us-west-2") == []
    assert provider_findings("eu-west-1") == [
        "provider region is 'eu-west-1', but the stack prod-us-west-2 is in us-west-2"
    ]
    assert provider_findings(None) == ["uses the default aws provider: pass the stack's explicit provider"]


def test_unknown_values_during_preview_do_not_pass_silently(analyzer: Any) -> None:
    template = _request(
        proto.AnalyzeRequest, "aws:ec2/launchTemplate:LaunchTemplate", "lt", {"metadataOptions": UNKNOWN_STRING}
    )
    diagnostics = analyzer.Analyze(template, None).diagnostics
    unknown = [d for d in diagnostics if d.policyName == "imdsv2-required"]
    assert unknown and "can't be known during preview" in unknown[0].message


def test_values_unknown_in_preview_that_rules_do_not_need(analyzer: Any) -> None:
    """A new KMS key's ARN and a new launch template's id are unknown in preview; the rules still decide."""
    eks = _request(
        proto.AnalyzeRequest,
        "aws:eks/cluster:Cluster",
        "eks",
        {"encryptionConfig": {"resources": ["secrets"], "provider": {"keyArn": UNKNOWN_STRING}}},
        protect=True,
    )
    assert not [d for d in analyzer.Analyze(eks, None).diagnostics if d.policyName == "eks-secrets-encrypted"]
    template = _request(
        proto.AnalyzerResource, "aws:ec2/launchTemplate:LaunchTemplate", "lt", {"instanceType": "p5.48xlarge"}
    )
    group = _request(
        proto.AnalyzerResource,
        "aws:autoscaling/group:Group",
        "gpu",
        {"launchTemplate": {"id": UNKNOWN_STRING}, "tags": [{"key": GPU_TEMPLATE_TAG, "value": "8"}]},
    )
    group.dependencies.append(template.urn)
    response = analyzer.AnalyzeStack(proto.AnalyzeStackRequest(resources=[template, group]), None)
    found = [d for d in response.diagnostics if d.policyName == "gpu-pool-scale-from-zero"]
    assert found and all("during preview" not in d.message for d in found)  # judged: discovery tags missing


def test_stack_policy_sees_dependencies_and_reports_the_resource(analyzer: Any) -> None:
    bucket = _request(proto.AnalyzerResource, "aws:s3/bucket:Bucket", "data", {"bucket": "d"}, protect=True)
    block = _request(
        proto.AnalyzerResource,
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "data-pab",
        dict.fromkeys(S3_BLOCK_FLAGS, True),
    )
    block.dependencies.append(bucket.urn)
    vpc = _request(proto.AnalyzerResource, "aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": "10.9.0.0/16"})
    request = proto.AnalyzeStackRequest(resources=[bucket, block, vpc])
    found = {(name, urn) for name, _, urn in _violations(analyzer.AnalyzeStack(request, None))}
    assert ("s3-encrypted", bucket.urn) in found
    assert ("vpc-cidr-planned", vpc.urn) in found
    assert not any(name == "s3-no-public-access" for name, _ in found)


def test_main_is_the_only_place_that_builds_the_pack() -> None:
    builders = []
    for path in [*ROOT.glob("policy/**/*.py"), *ROOT.glob("dlinfra/**/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "PolicyPack" for n in ast.walk(tree)):
            builders.append(path.relative_to(ROOT).as_posix())
    assert builders == ["policy/__main__.py"]


def test_policy_project_file() -> None:
    text = (ROOT / "policy" / "PulumiPolicy.yaml").read_text()
    assert "name: python" in text and Path(ROOT / "policy" / "requirements.txt").is_file()


def test_main_builds_the_pack_from_the_reference_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpy

    import pulumi_policy

    built: list[dict[str, Any]] = []
    monkeypatch.setattr(pulumi_policy, "PolicyPack", lambda **kwargs: built.append(kwargs))
    runpy.run_path(str(ROOT / "policy" / "__main__.py"), run_name="__main__")
    assert len(built) == 1 and built[0]["name"] == "dlinfra"
    assert [p.name for p in built[0]["policies"]] == [r.name for r in RULES]
    # The pack read the committed address plan: the planned VPC passes, another block does not.
    analyzer = policy._PolicyAnalyzerServicer(
        "dlinfra", "0.1.0", built[0]["policies"], EnforcementLevel.MANDATORY, *([None] * 7)
    )
    for cidr, expected in (("10.2.0.0/16", []), ("10.9.0.0/16", ["vpc-cidr-planned"])):
        vpc = _request(proto.AnalyzerResource, "aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": cidr})
        response = analyzer.AnalyzeStack(proto.AnalyzeStackRequest(resources=[vpc]), None)
        assert [d.policyName for d in response.diagnostics if d.policyName.startswith("vpc-cidr")] == expected


def test_stack_policy_sees_parents_when_ids_are_unknown(analyzer: Any) -> None:
    """In a first preview no group id is known: the Lustre rule finds a group's rules by their parent."""
    group = _request(proto.AnalyzerResource, "aws:ec2/securityGroup:SecurityGroup", "lustre-sg", {})
    nodes = _request(proto.AnalyzerResource, "aws:ec2/securityGroup:SecurityGroup", "nodes-sg", {})
    rule_type = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    # Each rule of one group admits the other: both depend on both groups, only the parent tells them apart.
    lnet = _request(proto.AnalyzerResource, rule_type, "lustre-988", {"securityGroupId": UNKNOWN_STRING})
    lnet.parent = group.urn
    lnet.dependencies.extend([group.urn, nodes.urn])
    peer = _request(proto.AnalyzerResource, rule_type, "nodes-from-lustre", {"securityGroupId": UNKNOWN_STRING})
    peer.parent = nodes.urn
    peer.dependencies.extend([nodes.urn, group.urn])

    def findings(*dependencies: Any) -> list[str]:
        fs = _request(
            proto.AnalyzerResource,
            "aws:fsx/lustreFileSystem:LustreFileSystem",
            "lustre",
            {"securityGroupIds": [UNKNOWN_STRING]},
        )
        fs.dependencies.extend(d.urn for d in dependencies)
        request = proto.AnalyzeStackRequest(resources=[group, nodes, lnet, peer, fs])
        return [m for name, m, _ in _violations(analyzer.AnalyzeStack(request, None)) if name.startswith("sg-rules")]

    (missing,) = findings(group)
    assert "does not depend on lustre-988:" in missing
    assert findings(group, lnet) == []
