"""The replacement table: it covers every type dlinfra emits, names real inputs, and drives the diff."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pulumi
import pytest

from dlinfra.model import replacement
from dlinfra.review.diff import render
from dlinfra.review.diff.changes import Change, Diff
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet
from tests import reference
from tests.conftest import ROOT

SDKS = {"aws": "pulumi_aws", "k8s": "pulumi_kubernetes", "tls": "pulumi_tls", "random": "pulumi_random"}
STACK = "prod-us-west-2"
PREFIX = f"urn:pulumi:{STACK}::dlinfra::"


def _token(cls: type) -> str:
    """The type token a Pulumi SDK class registers, read from its constructor."""
    match = re.search(r"__init__\(\s*'([^']+)'", inspect.getsource(cls))
    assert match, cls
    return match.group(1)


def _constructed_classes() -> dict[str, str]:
    """Every Pulumi resource class the code constructs (aws.ec2.Subnet(...)), by token, with where it is used."""
    out: dict[str, str] = {}
    for path in sorted([*ROOT.joinpath("components").rglob("*.py"), *ROOT.joinpath("dlinfra").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            parts: list[str] = []
            target: ast.expr = node.func
            while isinstance(target, ast.Attribute):
                parts.insert(0, target.attr)
                target = target.value
            if not isinstance(target, ast.Name) or target.id not in SDKS or not parts[-1][:1].isupper():
                continue
            obj: Any = importlib.import_module(SDKS[target.id])
            for part in parts:
                obj = getattr(obj, part)
            if inspect.isclass(obj) and issubclass(obj, pulumi.CustomResource) and obj.__name__ != "CustomResource":
                out.setdefault(_token(obj), f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_resource_class_the_code_constructs_has_replacement_data() -> None:
    constructed = _constructed_classes()
    assert len(constructed) > 60  # the scan finds the code's resources, not nothing
    missing = replacement.table().missing(constructed)
    assert not missing, {t: constructed[t] for t in missing}


def test_every_type_in_the_reference_plans_has_replacement_data() -> None:
    types = {r.type for res in reference.runs().values() for r in res.resources if r.custom}
    assert any(t.startswith("kubernetes:kueue.x-k8s.io/") for t in types)  # custom resources count, by kind
    replacement.table().require(types)


def _python_args(type_: str) -> set[str] | None:
    """The constructor arguments of a type's SDK class, or None for Kubernetes kinds and Pulumi built-ins."""
    package, module, _ = type_.split(":")
    sdk = {"aws": "pulumi_aws", "tls": "pulumi_tls", "random": "pulumi_random"}.get(package)
    if sdk is None:
        return None
    mod = module.split("/")[0]
    modname = f"{sdk}.{'lambda_' if mod == 'lambda' else mod}" if mod != "index" else sdk
    cls = getattr(importlib.import_module(modname), type_.rsplit(":", 1)[1])
    return set(inspect.signature(cls._internal_init).parameters) - {"__self__", "resource_name", "opts"}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def test_every_path_names_a_real_input_and_says_where_it_was_read() -> None:
    bad = []
    for type_, rule in replacement.table().rules.items():
        assert rule.source.strip() and "NOT FOUND" not in rule.source, type_
        args = _python_args(type_)
        if args is None:
            continue
        for path in [*rule.paths, *rule.conditional]:
            if _snake(path.split(".")[0]) not in args:
                bad.append(f"{type_}: {path}")
    assert not bad


def test_a_type_without_data_is_an_error_naming_it_and_the_file() -> None:
    unknown = {"urn": f"{PREFIX}aws:foo/bar:Bar::x", "type": "aws:foo/bar:Bar", "name": "x", "custom": True}
    plans = PlanSet("main", {STACK: {"resources": [unknown]}})
    with pytest.raises(replacement.ReplacementError) as err:
        compare(plans, plans)
    assert "aws:foo/bar:Bar" in str(err.value) and "dlinfra/data/replacements.yaml" in str(err.value)


def test_a_malformed_table_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "replacements.yaml"
    path.write_text("version: 1\ntypes:\n  aws:ec2/vpc:Vpc: {source: somewhere in a repo, replace_on: [a..b]}\n")
    with pytest.raises(replacement.ReplacementError, match=r"types\.aws:ec2/vpc:Vpc: bad input path 'a\.\.b'"):
        replacement.load(path)
    path.write_text("version: 1\ntypes:\n  aws:ec2/vpc:Vpc: {source: somewhere in a repo, replace_on: [], forces: 1}\n")
    with pytest.raises(replacement.ReplacementError, match=r"types\.aws:ec2/vpc:Vpc\.forces"):
        replacement.load(path)


def _resource(type_: str, name: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "urn": f"{PREFIX}{type_}::{name}",
        "type": type_,
        "name": name,
        "custom": True,
        "id": extra.pop("id", f"{name}-0123456789abcdef"),
        "inputs": inputs,
        **extra,
    }


def _changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Change]:
    result = compare(PlanSet("main", {STACK: {"resources": before}}), PlanSet("pr", {STACK: {"resources": after}}))
    return {c.name: c for c in result.changes}


CLUSTER = "aws:eks/cluster:Cluster"


def _cluster(**network: Any) -> dict[str, Any]:
    config = {"serviceIpv4Cidr": "10.3.224.0/20", "elasticLoadBalancing": {"enabled": False}, **network}
    inputs = {
        "name": "dlinfra-prod-usw2-eks",
        "vpcConfig": {"subnetIds": ["subnet-a"]},
        "kubernetesNetworkConfig": config,
    }
    return _resource(CLUSTER, "eks", inputs)


def test_a_path_inside_an_object_decides_between_update_and_replace() -> None:
    rule = replacement.table().rule(CLUSTER)
    # EKS changes subnets and load balancing in place (UpdateClusterConfig) but not the service range.
    assert "kubernetesNetworkConfig.serviceIpv4Cidr" in rule.paths and "kubernetesNetworkConfig" not in rule.paths
    assert not [p for p in rule.paths if p.startswith("vpcConfig")]
    updated = _changes([_cluster()], [_cluster(elasticLoadBalancing={"enabled": True})])["eks"]
    assert updated.action == "update" and updated.inputs == ("kubernetesNetworkConfig",)
    replaced = _changes([_cluster()], [_cluster(serviceIpv4Cidr="10.3.240.0/20")])["eks"]
    assert replaced.action == "replace" and replaced.inputs == ("kubernetesNetworkConfig.serviceIpv4Cidr",)
    moved = _cluster()
    moved["inputs"]["vpcConfig"] = {"subnetIds": ["subnet-b"]}
    assert _changes([_cluster()], [moved])["eks"].action == "update"


def _one(before: dict[str, Any], after: dict[str, Any]) -> tuple[Diff, Change]:
    result = compare(PlanSet("main", {STACK: {"resources": [before]}}), PlanSet("pr", {STACK: {"resources": [after]}}))
    (change,) = result.changes
    return result, change


LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"


@pytest.mark.parametrize(
    ("kind", "size", "action"),
    [("PERSISTENT_2", 1200, "replace"), ("PERSISTENT_2", 4800, "update"), ("SCRATCH_1", 4800, "replace")],
)
def test_fsx_storage_grows_in_place_and_shrinking_replaces(kind: str, size: int, action: str) -> None:
    before = _resource(LUSTRE, "lustre", {"storageCapacity": 2400, "deploymentType": kind}, protect=True)
    after = _resource(LUSTRE, "lustre", {"storageCapacity": size, "deploymentType": kind}, protect=True)
    result, change = _one(before, after)
    assert change.action == action and not change.conditional
    assert (change in result.blocking) == (action == "replace")  # protected data: the apply stops there


@pytest.mark.parametrize(
    ("after", "action"),
    [({"cidrIpv4": "10.5.0.0/16"}, "update"), ({"referencedSecurityGroupId": "sg-0123456789abcdef0"}, "replace")],
)
def test_a_security_group_rule_is_replaced_only_when_its_source_kind_changes(
    after: dict[str, Any], action: str
) -> None:
    rule = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    common = {"securityGroupId": "sg-0aaaaaaaaaaaaaaaa", "ipProtocol": "tcp", "fromPort": 443, "toPort": 443}
    _, change = _one(
        _resource(rule, "r", {**common, "cidrIpv4": "10.2.0.0/16"}), _resource(rule, "r", {**common, **after})
    )
    assert change.action == action and not change.conditional


def test_a_condition_the_diff_cannot_decide_is_an_update_that_may_replace() -> None:
    subnet = "aws:ec2/subnet:Subnet"
    assert isinstance(replacement.table().rule(subnet).conditional["ipv6CidrBlock"], str)
    common = {"cidrBlock": "10.2.0.0/18", "vpcId": "vpc-0123456789abcdef0"}
    result, change = _one(
        _resource(subnet, "s", {**common, "ipv6CidrBlock": "2600:1f14::/64"}),
        _resource(subnet, "s", {**common, "ipv6CidrBlock": "2600:1f14:0:1::/64"}),
    )
    assert change.action == "update" and change.conditional[0].startswith("ipv6CidrBlock: when it changes")
    markdown = render.render_markdown(result)
    assert markdown.index("replace the resource if the condition holds") < markdown.index("| stack | create |")
    assert render.to_json(result)["changes"][0]["may_replace"] == list(change.conditional)


def test_conditions_compare_versions_and_transitions() -> None:
    decrease = replacement.Condition(when="decrease", why="a downgrade replaces")
    assert replacement.holds(decrease, "2.15", "2.12", {}) and not replacement.holds(decrease, "2.12", "2.15", {})
    assert not replacement.holds(decrease, None, "2.15", {})
    enable = replacement.Condition.model_validate(
        {"when": "from-to", "from": "disable", "to": "enable", "why": "xxxxx"}
    )
    assert replacement.holds(enable, "disable", "enable", {}) and not replacement.holds(enable, "enable", "disable", {})
    unset = replacement.Condition(when="unset", why="removing replaces")
    assert replacement.holds(unset, [{"resources": ["secrets"]}], [], {}) and not replacement.holds(unset, [], [1], {})


def test_a_replaced_provider_replaces_every_resource_it_manages() -> None:
    provider = _resource("pulumi:providers:aws", "aws-us-west-2", {"region": "us-west-2"}, id="3ef45492ed59")
    vpc = _resource("aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": "10.2.0.0/16"})
    vpc["provider"] = f"{provider['urn']}::3ef45492ed59"
    moved = {**provider, "inputs": {"region": "us-east-2"}}
    rule = replacement.table().rule("pulumi:providers:aws")
    changes = _changes([provider, vpc], [moved, vpc])
    if "region" in rule.paths:
        assert changes["aws-us-west-2"].action == "replace"
        assert changes["vpc"].action == "replace" and changes["vpc"].inputs == ("(provider)",)
    else:
        assert changes["aws-us-west-2"].action == "update" and "vpc" not in changes
