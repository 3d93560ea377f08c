"""DevBox in the reference fleet's offline run: one GPU box (alice, prod, federated VPN) and one CPU box (bob,
staging, certificate VPN); what each declares, and what its args refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.dev_box import DevBoxArgs, home_mount_policy
from dlinfra.model import dev_boxes, images, naming, team_storage
from tests import reference
from tests.model.test_dev_boxes import ED25519, RSA_2048

INSTANCE = "aws:ec2/instance:Instance"
MANIFEST = images.load_manifest(reference.ROOT / images.EXAMPLE_MANIFEST)
BOXES = {"alice": ("prod-us-west-2", "gpu"), "bob": ("staging-us-west-2", "cpu")}


def _named(stack: str, name: str) -> Any:
    return reference.named(reference.runs()[stack], name)


def _by_id(stack: str) -> dict[str, Any]:
    return reference.by_id(reference.runs()[stack])


@pytest.mark.parametrize("person", sorted(BOXES))
def test_the_box_is_private_imdsv2_encrypted_and_stops_itself(person: str) -> None:
    stack, variant = BOXES[person]
    box = dev_boxes.plan(reference.fleet(), stack.split("-", 1)[0])[person]
    i = _named(stack, f"devbox-{person}-{variant}-instance").inputs
    assert i["ami"] == images.ami_for(MANIFEST, variant, "us-west-2")  # the pools' node image of its variant
    assert i["instanceType"] == box.instance_type
    assert i["associatePublicIpAddress"] is False
    assert i["metadataOptions"]["httpTokens"] == "required" and i["metadataOptions"]["httpPutResponseHopLimit"] == 1
    # The idle settings are tags the check reads through the instance metadata, not user data (which replaces).
    assert i["metadataOptions"]["instanceMetadataTags"] == "enabled"
    assert dev_boxes.idle_tags(box.idle_minutes).items() <= i["tags"].items()
    assert "idle" not in i["userData"].split("content: |\n", 1)[1].split("runcmd:")[0]
    root = i["rootBlockDevice"]
    assert (root["encrypted"], root["volumeType"], root["volumeSize"]) == (True, "gp3", 100)
    assert i["instanceInitiatedShutdownBehavior"] == "stop" and i["disableApiTermination"] is True
    assert i["userDataReplaceOnChange"] is True
    subnet = _by_id(stack)[i["subnetId"]]
    assert subnet.name == f"network-private-{box.zone}"  # its zone's private subnet: no public address on launch
    assert json.loads(i["userData"].split("content: |\n", 1)[1].split("runcmd:")[0])["uid"] == box.uid


@pytest.mark.parametrize("person", sorted(BOXES))
def test_only_ssh_from_the_laptop_vpn_comes_in(person: str) -> None:
    stack, _ = BOXES[person]
    run, ids = reference.runs()[stack], _by_id(stack)
    group = _named(stack, f"devbox-{person}-sg")
    ingress = [r for r in run.resources if r.type.endswith("SecurityGroupIngressRule") and r.parent == group.urn]
    (ssh,) = ingress
    assert (ssh.inputs["ipProtocol"], ssh.inputs["fromPort"], ssh.inputs["toPort"]) == ("tcp", 22, 22)
    assert ids[ssh.inputs["referencedSecurityGroupId"]].name == "client-vpn-sg"  # the endpoint's interfaces (NAT)
    assert "cidrIpv4" not in ssh.inputs
    egress = {
        r.name.rsplit("-sg-", 1)[1]: r.inputs for r in run.resources if r.parent == group.urn and "Egress" in r.type
    }
    assert sorted(egress) == ["to-efs", "to-http", "to-https"]
    assert egress["to-efs"]["cidrIpv4"] == str(reference.plan().vpc(stack.split("-", 1)[0], "us-west-2"))


def test_the_box_mounts_only_its_persons_home_and_admins_come_through_ssm() -> None:
    stack = "prod-us-west-2"
    policy = json.loads(_named(stack, "devbox-alice-home").inputs["policy"])
    (statement,) = policy["Statement"]
    arn = _named(stack, "storage-efs-home-alice").outputs["arn"]  # her own access point (team_storage.plan)
    assert statement["Condition"]["StringEquals"] == {"elasticfilesystem:AccessPointArn": arn}
    assert statement["Action"] == ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    ssm = _named(stack, "devbox-alice-ssm").inputs["policyArn"]
    assert ssm == "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    assert _named(stack, "storage-efs-home-alice").inputs["posixUser"]["uid"] == team_storage.posix_id(
        "person", "alice"
    )


def test_federated_boxes_are_authorized_to_their_persons_groups_only() -> None:
    prod, staging = reference.runs()["prod-us-west-2"], reference.runs()["staging-us-west-2"]
    rules = [r for r in prod.resources if r.name.startswith("devbox-alice-authorize-")]
    (rule,) = rules
    private_ip = _named("prod-us-west-2", "devbox-alice-gpu-instance").outputs["privateIp"]
    assert rule.inputs["targetNetworkCidr"] == f"{private_ip}/32"
    assert rule.inputs["accessGroupId"] == reference.fleet().teams["vision"].vpn_group
    # Certificate sign-in carries no group: no rule of its own; the key and the connect handler decide.
    assert not [r for r in staging.resources if r.name.startswith("devbox-bob-authorize-")]


@pytest.mark.parametrize("person", sorted(BOXES))
def test_the_idle_alarm_stops_the_box_only_on_its_checks_idle_verdict(person: str) -> None:
    stack, variant = BOXES[person]
    box = dev_boxes.plan(reference.fleet(), stack.split("-", 1)[0])[person]
    alarm = _named(stack, f"devbox-{person}-idle-alarm").inputs
    instance = _named(stack, f"devbox-{person}-{variant}-instance")
    assert alarm["alarmActions"] == ["arn:aws:automate:us-west-2:ec2:stop"]
    # The check's verdict (1 busy, 0 idle), per instance: a person at work is busy to it whatever the CPU shows.
    assert (alarm["namespace"], alarm["metricName"]) == ("dlinfra/DevBox", "Busy")
    assert alarm["dimensions"] == {"InstanceId": instance.id}
    assert (alarm["statistic"], alarm["comparisonOperator"], alarm["threshold"]) == ("Maximum", "LessThanThreshold", 1)
    assert alarm["datapointsToAlarm"] == alarm["evaluationPeriods"]  # every period reported idle
    assert alarm["period"] * alarm["evaluationPeriods"] == (box.idle_minutes + dev_boxes.BACKSTOP_EXTRA_MINUTES) * 60
    assert alarm["treatMissingData"] == "notBreaching"  # no verdict never stops anyone
    outputs = reference.runs()[stack].outputs["dev_boxes"][person]
    assert outputs["private_ip"] == instance.outputs["privateIp"] and outputs["instance_id"] == instance.id


@pytest.mark.parametrize("person", sorted(BOXES))
def test_the_check_may_publish_its_verdict_in_its_namespace_only(person: str) -> None:
    stack, _ = BOXES[person]
    policy = json.loads(_named(stack, f"devbox-{person}-verdict").inputs["policy"])
    (statement,) = policy["Statement"]
    assert statement["Action"] == "cloudwatch:PutMetricData" and statement["Resource"] == "*"
    assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": dev_boxes.BUSY_NAMESPACE}}


def test_a_change_between_cpu_and_gpu_types_makes_a_new_instance() -> None:
    # ignore_changes keeps the old image even when the instance is replaced (Pulumi puts the old value of an
    # ignored input in the goal state): only an instance of another name, which has no old state, boots the
    # other variant's image. The variant is part of the name.
    assert (_args().variant, _args(instance_type="m7i.2xlarge").variant) == ("gpu", "cpu")
    run = reference.runs()["prod-us-west-2"]
    names = [r.name for r in run.resources if r.type == INSTANCE]
    assert "devbox-alice-gpu-instance" in names and "devbox-alice-cpu-instance" not in names


def _args(**changes: Any) -> DevBoxArgs:
    base: dict[str, Any] = {
        "names": naming.Names(project="dlinfra", environment="prod", region="us-west-2"),
        "person": "alice",
        "uid": team_storage.posix_id("person", "alice"),
        "instance_type": "g6.xlarge",
        "ami_id": "ami-0a9d8c7b6a5f4e301",
        "subnet_id": "subnet-1",
        "vpc_id": "vpc-1",
        "vpc_cidr": "10.2.0.0/16",
        "laptop_security_group_id": "sg-1",
        "efs_file_system_id": "fs-1",
        "efs_file_system_arn": "arn:aws:elasticfilesystem:us-west-2:123456789012:file-system/fs-1",
        "home_access_point_id": "fsap-1",
        "home_access_point_arn": "arn:aws:elasticfilesystem:us-west-2:123456789012:access-point/fsap-1",
        "ssh_key": ED25519,
        "idle_minutes": 60,
    }
    return DevBoxArgs(**(base | changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ssh_key": RSA_2048}, "too weak"),
        ({"uid": 0}, "never root"),
        ({"idle_minutes": 10}, "idle_minutes"),
        ({"vpn_groups": {"vision": "g"}}, "need client_vpn_endpoint_id"),
        ({"instance_type": "g6.xlarg"}, "did you mean g6.xlarge"),
    ],
)
def test_args_refuse_what_would_break_the_box(changes: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, KeyError), match=message):
        _args(**changes)


def test_home_mount_policy_names_one_access_point_over_a_mount_target() -> None:
    policy = home_mount_policy("arn:fs", "arn:ap")
    (statement,) = policy["Statement"]  # type: ignore[misc]
    assert statement["Condition"] == {
        "StringEquals": {"elasticfilesystem:AccessPointArn": "arn:ap"},
        "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"},
    }
    assert "elasticfilesystem:ClientRootAccess" not in statement["Action"]
