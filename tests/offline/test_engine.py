"""The offline engine: deterministic plans, strict inputs, served invokes, StackReference, masked secrets."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dlinfra.model.stackroles import StackRole
from dlinfra.offline import engine
from tests.conftest import ROOT

ROLE = StackRole("regional", "prod", "us-west-2")


def _run(tmp_path: Path, body: str, *, exports: dict | None = None) -> engine.StackResult:
    """Run a small program as a project of its own (tmp_path, no Pulumi.yaml: default providers allowed)."""
    program = tmp_path / "program.py"
    program.write_text("import pulumi\nimport pulumi_aws as aws\n" + textwrap.dedent(body))
    return engine.run_stack(tmp_path, ROLE, project="t", config={}, stack_exports=exports or {}, program=program)


def test_ids_derive_from_urns_so_runs_are_identical(tmp_path: Path) -> None:
    body = """
    vpc = aws.ec2.Vpc("v", cidr_block="10.0.0.0/16")
    aws.ec2.Subnet("s", vpc_id=vpc.id, cidr_block="10.0.0.0/24")
    pulumi.export("vpc_id", vpc.id)
    """
    first = json.dumps(_run(tmp_path, body).plan("t"), sort_keys=True)
    second = json.dumps(_run(tmp_path, body).plan("t"), sort_keys=True)
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
        _run(tmp_path, body)


def test_plain_dict_with_known_snake_keys_is_translated(tmp_path: Path) -> None:
    result = _run(tmp_path, 'aws.ec2.LaunchTemplate("lt", metadata_options={"http_tokens": "required"})')
    (lt,) = result.resources
    assert lt.inputs["metadataOptions"] == {"httpTokens": "required"}


def test_invokes_served_from_data(tmp_path: Path) -> None:
    result = _run(
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
    result = _run(
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
    result = _run(
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


def test_secrets_are_masked_everywhere(tmp_path: Path) -> None:
    result = _run(
        tmp_path,
        """
        key = pulumi.Output.secret("psk.never.in.plain.text")
        aws.ec2.VpnConnection("v", customer_gateway_id="cgw-1", type="ipsec.1", tunnel1_preshared_key=key)
        pulumi.export("psk", key)
        pulumi.export("nested", {"k": key, "open": "visible"})
        """,
    )
    text = json.dumps(result.plan("t"))
    assert "psk.never.in.plain.text" not in text
    assert text.count(engine.MASK) >= 3
    assert result.plan("t")["outputs"]["nested"] == engine.MASK
    assert result.outputs["psk"] == "psk.never.in.plain.text"  # in memory, for StackReference consumers
    assert result.secret_outputs == {"psk", "nested"}


def test_stack_reference_resolves_to_exports(tmp_path: Path) -> None:
    exports = {"prod-eu-west-1": {"outputs": {"vpc_cidr": "10.0.0.0/16", "psk": "s3cr3t.value"}, "secret": ["psk"]}}
    result = _run(
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


def test_kubernetes_objects_become_manifests(tmp_path: Path) -> None:
    program = tmp_path / "k8s.py"
    program.write_text(
        textwrap.dedent(
            """
            import pulumi
            import pulumi_kubernetes as k8s
            opts = pulumi.ResourceOptions(provider=k8s.Provider("k", kubeconfig="{}"))
            k8s.core.v1.Namespace("team-a", metadata=k8s.meta.v1.ObjectMetaArgs(name="team-a"), opts=opts)
            k8s.helm.v3.Release("chart", chart="x", version="1.0.0", opts=opts)
            """
        )
    )
    result = engine.run_stack(ROOT, ROLE, project="t", config={}, stack_exports={}, program=program)
    assert engine.manifests(result) == [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}]
    path = engine.write_manifests(result, tmp_path / "manifests")
    assert path is not None and "kind: Namespace" in path.read_text()


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
        return _run(tmp_path / "v", MOVES + textwrap.dedent(resources)).plan("t")

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


def test_sdk_classes_are_found_through_the_sdks_registry() -> None:
    import pulumi_aws
    import pulumi_kubernetes

    assert engine.sdk_class("aws:ec2/vpc:Vpc") is pulumi_aws.ec2.Vpc
    assert engine.sdk_class("kubernetes:core/v1:ConfigMap") is pulumi_kubernetes.core.v1.ConfigMap
    assert engine.sdk_class("dlinfra:network:Network") is None  # a component: no provider SDK declares it
    # Every module a worker needs is imported before forking: the ones of every type the programs declare.
    assert {"pulumi_aws.ec2", "pulumi_aws.eks", "pulumi_kubernetes.helm.v3"} <= set(engine.preload_sdk_modules())
