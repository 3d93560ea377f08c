"""The dev box rules: no public address, SSH only from the Client VPN's group, a poweroff that stops, an idle alarm
that stops on the idle check's verdict only and within CloudWatch's day, a type sold in the region, tag keys the
instance metadata can serve."""

from __future__ import annotations

from typing import Any

import pytest

from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import CTX, messages, pass_and_fail, res

INSTANCE = "aws:ec2/instance:Instance"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ENDPOINT = "aws:ec2clientvpn/endpoint:Endpoint"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
BOX_TAGS = {"Name": "box", "dlinfra:dev-box": "alice"}

GOOD_BOX = {
    "instanceType": "g6.xlarge",
    "associatePublicIpAddress": False,
    "instanceInitiatedShutdownBehavior": "stop",
    "vpcSecurityGroupIds": ["sg-box"],
    "tags": BOX_TAGS,
}


def box(**changes: Any) -> Resource:
    return res(INSTANCE, "devbox-alice-instance", id="i-box")(**(GOOD_BOX | changes))


def ssh(**changes: Any) -> Resource:
    inputs = {"securityGroupId": "sg-box", "ipProtocol": "tcp", "fromPort": 22.0, "toPort": 22.0}
    return res(INGRESS, "ssh")(**(inputs | {"referencedSecurityGroupId": "sg-vpn"} | changes))


NETWORK = [
    res(SG, "client-vpn-sg", id="sg-vpn")(name="vpn"),
    res(ENDPOINT, "client-vpn-endpoint")(securityGroupIds=["sg-vpn"], clientCidrBlock="10.4.24.0/22"),
    res(SG, "devbox-alice-sg", id="sg-box")(name="box"),
]
ALARM_INPUTS = {
    "alarmActions": ["arn:aws:automate:us-west-2:ec2:stop"],
    "namespace": "dlinfra/DevBox",
    "metricName": "Busy",
    "dimensions": {"InstanceId": "i-box"},
    "statistic": "Maximum",
    "comparisonOperator": "LessThanThreshold",
    "threshold": 1.0,
    "period": 600.0,
    "evaluationPeriods": 12.0,
    "datapointsToAlarm": 12.0,
    "treatMissingData": "notBreaching",
}
# The backstop as it was first built: EC2's CPU under 2% stops a person connected and typing in an editor.
CPU_ALARM = ALARM_INPUTS | {
    "namespace": "AWS/EC2", "metricName": "CPUUtilization", "statistic": "Average", "threshold": 2.0,
}  # fmt: skip


def alarm(**changes: Any) -> Resource:
    return res(ALARM, "idle")(**(ALARM_INPUTS | changes))


CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "dev-box-private": (
        [box(), res(INSTANCE, "not-a-box")(associatePublicIpAddress=True)],
        [box(associatePublicIpAddress=True), res(INSTANCE)(**{k: v for k, v in GOOD_BOX.items() if "Public" not in k})],
    ),
    "dev-box-ssh-from-vpn-only": (
        [*NETWORK, box(), ssh()],
        [
            *NETWORK,
            box(),
            ssh(),
            # The VPC's range: every pod of the cluster could connect.
            res(INGRESS, "from-vpc")(
                securityGroupId="sg-box", ipProtocol="tcp", fromPort=22.0, toPort=22.0, cidrIpv4="10.2.0.0/16"
            ),
        ],
    ),
    "dev-box-stops-on-shutdown": (
        [box()],
        [box(instanceInitiatedShutdownBehavior="terminate")],
    ),
    "dev-box-idle-stop": (
        [box(), alarm()],
        [box(), alarm(**CPU_ALARM)],
    ),
    "instance-metadata-tag-keys": (
        [box(metadataOptions={"instanceMetadataTags": "enabled"}), res(INSTANCE, "other")(tags={"a/b": "x"})],
        [box(metadataOptions={"instanceMetadataTags": "enabled"}, tags=BOX_TAGS | {"cost centre": "ml"})],
    ),
    "dev-box-type-offered": (
        [box(), box(instanceType="m7i.2xlarge")],
        [res(INSTANCE, "eu", provider_inputs={"region": "eu-west-1"})(**GOOD_BOX)],  # no g6 in eu-west-1
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ([*NETWORK, box(), ssh(fromPort=0.0, toPort=65535.0)], "admits tcp 0-65535 from sg-vpn"),
        ([*NETWORK, box(), ssh(referencedSecurityGroupId="sg-nodes")], "from sg-nodes"),
        ([*NETWORK, box()], "admits no SSH from the Client VPN endpoint's group"),
        # The client range is translated away by Client VPN: such a rule matches nothing, and is refused.
        ([*NETWORK, box(), ssh(referencedSecurityGroupId=None, cidrIpv4="10.4.24.0/22")], "from 10.4.24.0/22"),
        ([NETWORK[0], NETWORK[1], box()], "has no security group of its own"),
    ],
)
def test_ssh_rule_details(resources: list[Resource], expected: str) -> None:
    found = messages("dev-box-ssh-from-vpn-only", resources)
    assert any(expected in m for m in found), found


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"evaluationPeriods": 289.0, "datapointsToAlarm": 289.0}, "over CloudWatch's one day"),
        ({"treatMissingData": "breaching"}, "no verdict (a stopped box, a check that cannot reach CloudWatch)"),
        (CPU_ALARM, "stops the box on AWS/EC2/CPUUtilization, not on its idle check's verdict"),
        ({"statistic": "Average"}, "statistic Maximum, less than 1"),  # one busy verdict of two would not count
        ({"threshold": 2.0}, "statistic Maximum, less than 1"),  # busy (1) would count as idle
        ({"datapointsToAlarm": 6.0}, "one busy period in the window keeps the box"),
        ({"period": 300.0, "evaluationPeriods": 24.0, "datapointsToAlarm": 24.0}, "can hold no verdict"),
        ({"alarmActions": ["arn:aws:sns:us-west-2:123456789012:topic"]}, "no CloudWatch alarm on this dev box"),
        ({"dimensions": {"InstanceId": "i-other"}}, "no CloudWatch alarm on this dev box"),
        ({"alarmActions": ["arn:aws:automate:us-east-1:ec2:stop"]}, "with the action arn:aws:automate:us-west-2"),
    ],
)
def test_idle_alarm_details(changes: dict[str, Any], expected: str) -> None:
    found = messages("dev-box-idle-stop", [box(), alarm(**changes)])
    assert any(expected in m for m in found), found


def test_imds_tag_keys_name_the_bad_ones() -> None:
    tags = BOX_TAGS | {"kubernetes.io/cluster/x": "owned", "_index": "1", "ok+=.,_:@": "1"}
    served = box(metadataOptions={"instanceMetadataTags": "enabled"}, tags=tags)
    (message,) = messages("instance-metadata-tag-keys", [served])
    assert "'_index', 'kubernetes.io/cluster/x' cannot be served" in message


def test_unset_public_address_and_unknown_type_are_named() -> None:
    unset = {k: v for k, v in GOOD_BOX.items() if k != "associatePublicIpAddress"}
    assert "is unset" in messages("dev-box-private", [res(INSTANCE)(**unset)])[0]
    assert "not in dlinfra's instance table" in messages("dev-box-type-offered", [box(instanceType="zz9.huge")])[0]
    assert CTX.gpu_count("g6.xlarge") == 1
