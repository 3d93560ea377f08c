"""The offline engine: deterministic plans, strict inputs, served invokes, StackReference, recorded options."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dlinfra.offline import engine
from tests.offline.programs import ROLE, run_program


def test_ids_derive_from_urns_so_runs_are_identical(tmp_path: Path) -> None:
    body = """
    vpc = aws.ec2.Vpc("v", cidr_block="10.0.0.0/16")
    aws.ec2.Subnet("s", vpc_id=vpc.id, cidr_block="10.0.0.0/24")
    pulumi.export("vpc_id", vpc.id)
    """
    first = json.dumps(run_program(tmp_path, body).plan("t"), sort_keys=True)
    second = json.dumps(run_program(tmp_path, body).plan("t"), sort_keys=True)
    assert first == second
    plan = json.loads(first)
    vpc = next(r for r in plan["resources"] if r["type"] == "aws:ec2/vpc:Vpc")
    assert vpc["id"].startswith("vpc-") and len(vpc["id"]) == 21
    assert vpc["outputs"]["arn"] == f"arn:aws:ec2:us-west-2:123456789012:vpc/{vpc['id']}"
    subnet = next(r for r in plan["resources"] if r["type"] == "aws:ec2/subnet:Subnet")
    assert subnet["inputs"]["vpcId"] == vpc["id"]
    assert vpc["urn"] in subnet["dependencies"]
    assert plan["outputs"]["vpc_id"] == vpc["id"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            'aws.ec2.LaunchTemplate("lt", metadata_options={"http_tokens": "required", '
            '"http_put_response_hop_limt": 1})',
            r"metadataOptions.http_put_response_hop_limt: not an input of LaunchTemplateMetadataOptionsArgs "
            r"\(did you mean 'httpPutResponseHopLimit'\?\)",
            id="typo-in-plain-dict",
        ),
        pytest.param(
            'aws.ec2.LaunchTemplate("lt", block_device_mappings=[{"device_name": "/dev/sda1", '
            '"ebs": {"volume_sise": 8}}])',
            r"blockDeviceMappings\[0\].ebs.volume_sise: not an input",
            id="typo-deep-in-list",
        ),
        pytest.param(
            'aws.s3.BucketVersioning("v", bucket="b", '
            'versioning_configuration={"status": "Enabled", "mfa_delet": "x"})',
            r"versioningConfiguration.mfa_delet: not an input of BucketVersioningVersioningConfigurationArgs",
            id="typo-in-init-args-resource",
        ),
        pytest.param(
            'aws.fsx.LustreFileSystem("l", deployment_type="PERSISTENT_2", subnet_ids=["a"], storage_capacity=1200)',
            r"While processing resource: 'l'.*Expected 'list' got",
            id="sdk-type-check-names-the-resource",
        ),
        pytest.param(
            'aws.ec2.get_ami(owners=["099720109477"], most_recent=True)',
            r"invoke aws:ec2/getAmi:getAmi is not served by the offline engine",
            id="unknown-invoke",
        ),
        pytest.param(
            'pulumi.StackReference("r", stack_name="org/t/prod-eu-west-1")',
            r"stack 'prod-eu-west-1' has not been previewed",
            id="reference-before-preview",
        ),
    ],
)
def test_failures_are_clear(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(engine.EngineError, match=message):
        run_program(tmp_path, body)


def test_plain_dict_with_known_snake_keys_is_translated(tmp_path: Path) -> None:
    result = run_program(tmp_path, 'aws.ec2.LaunchTemplate("lt", metadata_options={"http_tokens": "required"})')
    (lt,) = result.resources
    assert lt.inputs["metadataOptions"] == {"httpTokens": "required"}


def test_invokes_served_from_data(tmp_path: Path) -> None:
    result = run_program(
        tmp_path,
        """
        azs = aws.get_availability_zones(state="available")
        pulumi.export("azs", azs.names)
        pulumi.export("account", aws.get_caller_identity().account_id)
        """,
    )
    assert result.outputs["azs"] == ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]
    assert result.outputs["account"] == "123456789012"


def test_explicit_provider_sets_the_region(tmp_path: Path) -> None:
    result = run_program(
        tmp_path,
        """
        eu = aws.Provider("eu", region="eu-west-1")
        vpc = aws.ec2.Vpc("v", cidr_block="10.0.0.0/16", opts=pulumi.ResourceOptions(provider=eu))
        pulumi.export("arn", vpc.arn)
        """,
    )
    assert result.outputs["arn"].startswith("arn:aws:ec2:eu-west-1:")
    vpc = next(r for r in result.resources if r.type == "aws:ec2/vpc:Vpc")
    assert vpc.provider and "pulumi:providers:aws::eu" in vpc.provider


def test_options_are_recorded(tmp_path: Path) -> None:
    result = run_program(
        tmp_path,
        """
        aws.s3.Bucket("b", opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True,
                      aliases=[pulumi.Alias(name="old-b")]))
        """,
    )
    plan = result.plan("t")
    (bucket,) = plan["resources"]
    assert bucket["protect"] is True and bucket["retain_on_delete"] is True
    assert bucket["aliases"] and "old-b" in bucket["aliases"][0]


def test_stack_reference_resolves_to_exports(tmp_path: Path) -> None:
    exports = {"prod-eu-west-1": {"outputs": {"vpc_cidr": "10.0.0.0/16", "psk": "s3cr3t.value"}, "secret": ["psk"]}}
    result = run_program(
        tmp_path,
        """
        ref = pulumi.StackReference("r", stack_name="org/t/prod-eu-west-1")
        pulumi.export("cidr", ref.get_output("vpc_cidr"))
        pulumi.export("psk", ref.get_output("psk"))
        """,
        exports=exports,
    )
    assert result.outputs["cidr"] == "10.0.0.0/16"
    assert "psk" in result.secret_outputs
    assert "s3cr3t.value" not in json.dumps(result.plan("t"))


MOVES = """
class Box(pulumi.ComponentResource):
    def __init__(self, name, opts=None):
        super().__init__("t:index:Box", name, None, opts)
        self.register_outputs({})

box = Box("box")
"""


def test_moves_and_renames_recorded_so_the_diff_follows_them(tmp_path: Path) -> None:
    """Alias specs keep their parent (or noParent) next to a name: `dlinfra diff` rebuilds old URNs from them."""
    from dlinfra.review.diff.compare import compare_stack

    def run(resources: str) -> dict:
        (tmp_path / "v").mkdir(exist_ok=True)
        return run_program(tmp_path / "v", MOVES + textwrap.dedent(resources)).plan("t")

    before = run(
        """
        bucket = aws.s3.Bucket("box-data", opts=pulumi.ResourceOptions(parent=box))
        aws.s3.BucketVersioning("box-data-versioning", bucket=bucket.id,
            versioning_configuration={"status": "Enabled"}, opts=pulumi.ResourceOptions(parent=bucket))
        aws.sqs.Queue("old-queue")
        """
    )
    after = run(
        """
        bucket = aws.s3.Bucket("box-data", opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(parent=box)]))
        aws.s3.BucketVersioning("box-data-versioning", bucket=bucket.id,
            versioning_configuration={"status": "Enabled"}, opts=pulumi.ResourceOptions(parent=bucket))
        aws.sqs.Queue("queue", opts=pulumi.ResourceOptions(parent=box,
            aliases=[pulumi.Alias(name="old-queue", parent=None)]))
        """
    )
    aliases = {r["name"]: r["aliases"] for r in after["resources"]}
    box_urn = next(r["urn"] for r in before["resources"] if r["name"] == "box")
    assert f"parent={box_urn}" in aliases["box-data"]  # beside the SDK's own type alias (bucketV2)
    assert "name=old-queue,noParent=true" in aliases["queue"]
    assert compare_stack(ROLE.name, before, after) == []
