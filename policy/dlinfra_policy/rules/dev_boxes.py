"""Rules for dev boxes (instances tagged `dlinfra:dev-box`, components/dev_box.py): no public address, SSH only from
the laptop VPN's interfaces, a poweroff that stops, an idle alarm that stops on the box's own idle verdict only, a
type sold where the box launches, and tag keys the instance metadata can serve.
IMDSv2 and the encrypted root are the rules every instance meets (imdsv2-required, ebs-encrypted)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from dlinfra.model import instances
from dlinfra.model.dev_boxes import ALARM_MAX_SECONDS, ALARM_PERIOD_SECONDS, BUSY_METRIC, BUSY_NAMESPACE, DEV_BOX_TAG

from .core import Context, Resource, Violation, as_int, as_list, as_object, has_key, tags_of

INSTANCE = "aws:ec2/instance:Instance"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
CLIENT_VPN = "aws:ec2clientvpn/endpoint:Endpoint"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
SSH_PORT = 22


def _is_box(resource: Resource) -> bool:
    return resource.type == INSTANCE and DEV_BOX_TAG in tags_of(resource)


def dev_box_private(resource: Resource, ctx: Context) -> list[str]:
    """A dev box asks for no public address, whatever its subnet's default: EC2 gives an instance launched in a subnet
    that maps public addresses on launch one unless the request says otherwise (EC2 API, RunInstances
    NetworkInterface AssociatePublicIpAddress; VPC user guide, "IP addressing for your VPCs and subnets")."""
    if not _is_box(resource):
        return []
    if resource.inputs.get("associatePublicIpAddress") is False:
        return []
    state = "unset" if not has_key(resource.inputs, "associatePublicIpAddress") else "true"
    return [f"associatePublicIpAddress is {state}: a dev box is reached over the laptop VPN only; set it to false"]


def dev_box_stops_on_shutdown(resource: Resource, ctx: Context) -> list[str]:
    """A dev box's poweroff (its idle check) stops it: with `terminate` EC2 would delete it, root volume and all,
    and the next apply would launch a new one (EC2 user guide, "Change the instance initiated shutdown behavior")."""
    if not _is_box(resource):
        return []
    behaviour = resource.inputs.get("instanceInitiatedShutdownBehavior")
    if behaviour == "stop":
        return []
    return [f'instanceInitiatedShutdownBehavior is {behaviour or "unset"}: set "stop", so idling stops the box']


def dev_box_type_offered(resource: Resource, ctx: Context) -> list[str]:
    """A dev box's instance type is sold in the region it launches in (dlinfra's instance table, or the lab's
    catalog): RunInstances fails with Unsupported otherwise, at apply. The table knows regions, not AZs: a type
    missing from the box's AZ fails the same way, and `zone:` in the fleet moves the box."""
    if not _is_box(resource):
        return []
    region = str(resource.provider_inputs.get("region") or "")
    name = str(resource.inputs.get("instanceType") or "")
    try:
        if not region or instances.offered(name, region):
            return []
    except instances.UnknownInstanceType:
        return [f"instanceType {name!r} is not in dlinfra's instance table or the lab's catalog"]
    return [f"{name} is not sold in {region}: choose a type offered there (dlinfra/data/instance_types.yaml)"]


def _groups_of(box: Resource, resources: Sequence[Resource]) -> list[Resource]:
    ids = {str(g) for g in as_list(box.inputs.get("vpcSecurityGroupIds"))}
    return [r for r in resources if r.type == SECURITY_GROUP and ((r.id and r.id in ids) or r.urn in box.dependencies)]


def _laptop_groups(resources: Sequence[Resource]) -> tuple[set[str], set[str]]:
    """(ids, URNs) of the Client VPN endpoints' security groups in the stack."""
    endpoints = [r for r in resources if r.type == CLIENT_VPN]
    ids = {str(g) for e in endpoints for g in as_list(e.inputs.get("securityGroupIds"))}
    urns = {
        r.urn
        for r in resources
        if r.type == SECURITY_GROUP and ((r.id and r.id in ids) or any(r.urn in e.dependencies for e in endpoints))
    }
    return ids, urns


def dev_box_ssh_from_vpn_only(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A dev box's security groups admit SSH (TCP 22) from the laptop VPN endpoint's security group, and nothing
    else. Client VPN source-NATs laptops to its interfaces in the associated subnets (Client VPN admin guide, "How
    AWS Client VPN works"), so a rule for the client CIDR matches nothing and a VPC CIDR rule admits every pod."""
    laptop_ids, laptop_urns = _laptop_groups(resources)
    out: list[Violation] = []
    for box in (r for r in resources if _is_box(r)):
        groups = _groups_of(box, resources)
        if not groups:
            out.append(Violation(box.urn, "has no security group of its own in the stack to judge"))
        for group in groups:
            if as_list(group.inputs.get("ingress")):
                out.append(Violation(group.urn, "inline ingress on a dev box's group: declare one SSH rule instead"))
            rules = [
                r
                for r in resources
                if r.type == INGRESS
                and ((group.id and r.inputs.get("securityGroupId") == group.id) or group.urn in r.dependencies)
            ]
            ssh = 0
            for rule in rules:
                peer = str(rule.inputs.get("referencedSecurityGroupId") or "")
                ports = (str(rule.inputs.get("ipProtocol")), as_int(rule.inputs.get("fromPort")))
                to_port = as_int(rule.inputs.get("toPort"))
                from_vpn = bool(peer) and (peer in laptop_ids or any(u in rule.dependencies for u in laptop_urns))
                if ports == ("tcp", SSH_PORT) and to_port == SSH_PORT and from_vpn:
                    ssh += 1
                    continue
                source = rule.inputs.get("cidrIpv4") or peer or rule.inputs.get("prefixListId") or "?"
                out.append(
                    Violation(
                        rule.urn,
                        f"admits {ports[0]} {ports[1]}-{to_port} from {source} to a dev box: only SSH (tcp 22) from "
                        "the Client VPN endpoint's security group",
                    )
                )
            if not ssh:
                out.append(
                    Violation(group.urn, "admits no SSH from the Client VPN endpoint's group: nobody reaches it")
                )
    return out


def _stops_on_the_verdict_only(alarm: Resource) -> list[str]:
    """What is wrong with a dev box's stopping alarm: it must act on the idle check's verdict (dev_boxes.BUSY_METRIC),
    only when every period of its window was reported idle, and never on missing data."""
    out = []
    metric = (alarm.inputs.get("namespace"), alarm.inputs.get("metricName"))
    if metric != (BUSY_NAMESPACE, BUSY_METRIC):
        out.append(
            f"stops the box on {metric[0]}/{metric[1]}, not on its idle check's verdict {BUSY_NAMESPACE}/{BUSY_METRIC}:"
            " a person connected and doing light work (an editor, a log) would be stopped"
        )
        return out
    operator, threshold = alarm.inputs.get("comparisonOperator"), alarm.inputs.get("threshold")
    idle_only = alarm.inputs.get("statistic") == "Maximum" and (
        (operator == "LessThanThreshold" and isinstance(threshold, int | float) and 0 < threshold <= 1)
        or (operator == "LessThanOrEqualToThreshold" and isinstance(threshold, int | float) and 0 <= threshold < 1)
    )
    if not idle_only:
        out.append("must alarm only on periods whose every verdict was idle: statistic Maximum, less than 1")
    periods = as_int(alarm.inputs.get("evaluationPeriods")) or 0
    if as_int(alarm.inputs.get("datapointsToAlarm")) not in (None, periods):
        out.append("datapointsToAlarm must equal evaluationPeriods: one busy period in the window keeps the box")
    if (as_int(alarm.inputs.get("period")) or 0) < ALARM_PERIOD_SECONDS:
        out.append(
            f"period under {ALARM_PERIOD_SECONDS} s (two idle checks): a period can hold no verdict, and with every "
            "period required the alarm would never act"
        )
    if alarm.inputs.get("treatMissingData") == "breaching":
        out.append(
            'treatMissingData "breaching": no verdict (a stopped box, a check that cannot reach CloudWatch) is not '
            "idleness, and would stop a person at work"
        )
    return out


def dev_box_idle_stop(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every dev box has a CloudWatch alarm that stops it (EC2 action arn:aws:automate:<region>:ec2:stop, CloudWatch
    user guide "Create alarms to stop, terminate, reboot, or recover an EC2 instance": a per-instance metric, which a
    custom metric is when it has the InstanceId dimension) on its own InstanceId, that evaluates at most a day
    (PutMetricAlarm: EvaluationPeriods x Period <= 86,400 s). Every alarm that stops it acts on the box's idle check's
    verdict only (never on the CPU, which is low while a person edits or reads), when every period was reported idle,
    and never on missing data."""
    alarms = [r for r in resources if r.type == ALARM]
    out: list[Violation] = []
    for box in (r for r in resources if _is_box(r)):
        region = str(box.provider_inputs.get("region") or "")
        mine = [
            a
            for a in alarms
            if (box.id and as_object(a.inputs.get("dimensions")).get("InstanceId") == box.id)
            or box.urn in a.dependencies
        ]
        stop = f"arn:aws:automate:{region}:ec2:stop"
        stopping = [a for a in mine if stop in [str(x) for x in as_list(a.inputs.get("alarmActions"))]]
        if not stopping:
            out.append(Violation(box.urn, f"no CloudWatch alarm on this dev box with the action {stop}"))
        for alarm in stopping:
            period, periods = (
                as_int(alarm.inputs.get("period")) or 0,
                as_int(alarm.inputs.get("evaluationPeriods")) or 0,
            )
            if period * periods > ALARM_MAX_SECONDS:
                out.append(Violation(alarm.urn, f"evaluates {period} s x {periods} periods, over CloudWatch's one day"))
            out += [Violation(alarm.urn, message) for message in _stops_on_the_verdict_only(alarm)]
    return out


# Tag keys the instance metadata service can serve (EC2 user guide, "View tags for your EC2 instances using instance
# metadata": letters, digits and + - = . , _ : @; no spaces or '/'; not '.', '..' or '_index').
_IMDS_TAG_KEY = re.compile(r"[A-Za-z0-9+\-=.,_:@]+")


def instance_metadata_tag_keys(resource: Resource, ctx: Context) -> list[str]:
    """An instance that serves its tags through the instance metadata (dev boxes: their idle settings) has only tag
    keys IMDS accepts: with another, EC2 refuses the launch ("Non-compliance will result in failed launches")."""
    if resource.type != INSTANCE:
        return []
    if as_object(resource.inputs.get("metadataOptions")).get("instanceMetadataTags") != "enabled":
        return []
    bad = sorted(k for k in tags_of(resource) if not _IMDS_TAG_KEY.fullmatch(k) or k in (".", "..", "_index"))
    if not bad:
        return []
    return [
        f"tag key(s) {', '.join(repr(k) for k in bad)} cannot be served by the instance metadata "
        "(instanceMetadataTags enabled): only letters, digits and + - = . , _ : @; EC2 refuses the launch"
    ]
