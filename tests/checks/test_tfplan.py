"""The Terraform-plan export checkov reads: golden file, shapes, references, unknown types, reference plans."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks import tfplan
from dlinfra.checks.plans import load_plan
from dlinfra.offline import plan_export
from tests import reference

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "test-us-west-2.json"
GOLDEN = HERE / "golden" / "test-us-west-2.tfplan.json"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def fixture_plan() -> dict[str, Any]:
    return dict(load_plan(FIXTURE).data)


@pytest.fixture(scope="module")
def exported(fixture_plan: dict[str, Any]) -> tfplan.TerraformPlan:
    return tfplan.export(fixture_plan, source=str(FIXTURE))


def _resource(export: tfplan.TerraformPlan, address: str, section: str = "planned") -> dict[str, Any]:
    if section == "planned":
        items = export.document["planned_values"]["root_module"]["resources"]
    else:
        items = export.document["configuration"]["root_module"]["resources"]
    (found,) = [r for r in items if r["address"] == address]
    return dict(found)


def test_export_matches_golden(exported: tfplan.TerraformPlan) -> None:
    text = json.dumps(exported.document, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"{GOLDEN} is missing: run UPDATE_GOLDEN=1 pytest tests/checks/test_tfplan.py"
    assert text == GOLDEN.read_text(), "export changed: review, then UPDATE_GOLDEN=1 pytest tests/checks"


def test_shape_is_what_checkov_reads(exported: tfplan.TerraformPlan) -> None:
    doc = exported.document
    assert doc["terraform_version"] and doc["format_version"]
    sg = _resource(exported, "aws_security_group.bastion-sg")
    assert sg["mode"] == "managed" and sg["type"] == "aws_security_group" and sg["name"] == "bastion-sg"
    (ingress,) = sg["values"]["ingress"]
    assert ingress == {
        "cidr_blocks": ["0.0.0.0/0"],
        "description": "ssh from anywhere",
        "from_port": 22,
        "protocol": "tcp",
        "to_port": 22,
    }
    template = _resource(exported, "aws_launch_template.gpu-lt")["values"]
    assert template["metadata_options"] == [
        {"http_endpoint": "enabled", "http_put_response_hop_limit": 1, "http_tokens": "required"}
    ]
    assert template["block_device_mappings"][0]["ebs"][0]["encrypted"] == "true"  # nested object: one-element list
    assert template["tag_specifications"][0]["tags"]["component"] == "test"  # maps stay maps
    assert _resource(exported, "aws_efs_file_system.scratch-efs")["values"]["lifecycle_policy"] == [
        {"transition_to_ia": "AFTER_30_DAYS"}
    ]


def test_renamed_blocks_and_tags(exported: tfplan.TerraformPlan) -> None:
    group = _resource(exported, "aws_autoscaling_group.gpu-asg")["values"]
    assert "tags" not in group and {"key": "project", "propagate_at_launch": True, "value": "dlinfra"} in group["tag"]
    assert _resource(exported, "aws_vpc.network-vpc")["values"]["tags"]["project"] == "dlinfra"


def test_ids_become_references(exported: tfplan.TerraformPlan) -> None:
    mount = _resource(exported, "aws_efs_mount_target.scratch-mt-us-west-2a", "configuration")
    assert mount["expressions"]["file_system_id"]["references"] == [
        "aws_efs_file_system.scratch-efs.id",
        "aws_efs_file_system.scratch-efs",
    ]
    assert "file_system_id" not in _resource(exported, "aws_efs_mount_target.scratch-mt-us-west-2a")["values"]
    group = _resource(exported, "aws_autoscaling_group.gpu-asg", "configuration")
    assert group["expressions"]["launch_template"] == [
        {"id": {"references": ["aws_launch_template.gpu-lt.id", "aws_launch_template.gpu-lt"]}}
    ]


def test_what_is_not_exported(exported: tfplan.TerraformPlan) -> None:
    types = {a.split(".")[0] for a in exported.addresses}
    assert not any(t.startswith(("dlinfra", "pulumi", "kubernetes")) for t in types)
    assert {"random_password", "tls_private_key", "aws_eip"} <= types
    assert len(exported.kubernetes) == 1 and exported.kubernetes[0].endswith("::team-vision")
    assert exported.skipped == 3  # the component, the provider and the stack reference


def test_explicit_providers_are_provider_configs(exported: tfplan.TerraformPlan) -> None:
    config = exported.document["configuration"]
    assert config["provider_config"]["aws.aws-us-east-1"]["expressions"]["region"]["constant_value"] == "us-east-1"
    assert config["provider_config"]["aws"]["expressions"]["region"]["constant_value"] == "us-west-2"
    assert _resource(exported, "aws_eip.peer-eip", "configuration")["provider_config_key"] == "aws.aws-us-east-1"


def test_unknown_type_is_an_error_listing_it(fixture_plan: dict[str, Any]) -> None:
    plan = copy.deepcopy(fixture_plan)
    extra = copy.deepcopy(plan["resources"][1])
    plan["resources"] += [
        {**extra, "type": "acme:index/widget:Widget", "urn": extra["urn"] + "w"},
        {**extra, "type": "aws:sagemaker/domain:Domain", "urn": extra["urn"] + "d"},
    ]
    with pytest.raises(tfplan.TfPlanError) as err:
        tfplan.export(plan, source="p.json")
    assert "acme:index/widget:Widget, aws:sagemaker/domain:Domain" in str(err.value)
    assert str(err.value).startswith("p.json: ")


@pytest.mark.parametrize(
    ("camel", "snake"),
    [
        ("cidrBlock", "cidr_block"),
        ("tunnel1Phase1DhGroupNumbers", "tunnel1_phase1_dh_group_numbers"),
        ("ipv6CidrBlock", "ipv6_cidr_block"),
        ("enableDns64", "enable_dns64"),
        ("kmsKeyId", "kms_key_id"),
    ],
)
def test_snake_case(camel: str, snake: str) -> None:
    assert tfplan.snake(camel) == snake


def test_every_type_of_the_reference_fleet_is_mapped(tmp_path: Path) -> None:
    runs = reference.runs()
    for result in runs.values():
        plan = result.plan(reference.fleet().project)
        assert tfplan.unknown_types(plan) == [], f"{result.role.name}: add these to TERRAFORM_TYPES"
        export = tfplan.export(plan, source=result.role.name)
        if result.role.kind == "k8s":  # only Kubernetes objects: scanned as rendered manifests instead
            assert export.kubernetes and not export.addresses, result.role.name
        else:
            assert export.addresses or result.role.kind == "global"
        plan_export.write_plan(result, reference.fleet().project, tmp_path)
