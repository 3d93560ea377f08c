"""DevBox: one person's interactive machine, an EC2 instance on the node image, reachable over the laptop VPN (SSH,
the person's key only) and through SSM Session Manager (admins), its home the person's own EFS access point, stopped
when idle.

Why an instance and not a pod: docs/dev-boxes.md, "Instances, not pods". What the box must never have, and what could
bite at apply, is kept as CrossGuard rules (policy/dlinfra_policy/rules/dev_boxes.py) and reachability intents
(dlinfra/checks/reach/dev_box_intents.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pulumi
import pulumi_aws as aws

from components import security_groups as sg
from components.efs_policy import ACCESS_POINT_ARN, CLIENT_MOUNT, CLIENT_WRITE, VIA_MOUNT_TARGET
from components.iam import service_trust
from dlinfra.model import dev_boxes, instances
from dlinfra.model.fleet.devboxes import MAX_IDLE_MINUTES, MIN_IDLE_MINUTES, ssh_public_key
from dlinfra.model.naming import Names

TEMPLATES = Path(__file__).parent / "templates"
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)
SSM_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"  # Session Manager: the admins' way in
USER_DATA_LIMIT = 16384  # bytes (EC2 API reference, RunInstances UserData)
SSH_PORT = 22
NFS_PORT = 2049
ROOT_DEVICE = "/dev/sda1"  # Ubuntu AMIs boot from /dev/sda1 (as the node pools' launch templates)
CONFIG_PATH = "/etc/dlinfra/devbox.json"  # chef/cookbooks/dlinfra_devbox attributes: config
SETUP_PATH = "/usr/local/sbin/dlinfra-devbox-setup"  # chef/cookbooks/dlinfra_devbox attributes: setup_script


@dataclass(frozen=True, kw_only=True)
class DevBoxArgs:
    names: Names  # naming and tags of this (regional) stack
    person: str  # whose box: part of every child's name, and the login user
    uid: int  # the login user's uid and gid: the person's home access point's (team_storage.posix_id)
    instance_type: str  # from the instance catalog; GPU types boot the gpu image
    ami_id: str  # the node image of the box's variant in this region (dlinfra.model.images.ami_for)
    subnet_id: pulumi.Input[str]  # a private subnet (no public address on launch) in the box's zone
    vpc_id: pulumi.Input[str]
    vpc_cidr: str  # the box reaches EFS mount targets and interface endpoints in it
    laptop_security_group_id: pulumi.Input[str]  # the Client VPN endpoint's group: the only SSH source
    efs_file_system_id: pulumi.Input[str]
    efs_file_system_arn: pulumi.Input[str]
    home_access_point_id: pulumi.Input[str]  # the person's own access point (home-<person>)
    home_access_point_arn: pulumi.Input[str]
    ssh_key: str  # the person's OpenSSH public key, the only one the box accepts
    idle_minutes: int  # idle this long, the box powers itself off (and EC2 stops it); an instance tag, not user data
    root_volume_gib: int = 100  # encrypted gp3 root; work belongs in the home
    # Federated (SAML) laptop VPN: the endpoint, and the person's IdP groups by team. Each gets an authorization rule
    # for the box's address alone, which then admits no other group ({} with certificate sign-in: no groups there).
    client_vpn_endpoint_id: pulumi.Input[str] | None = None
    vpn_groups: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        instances.lookup(self.instance_type)  # raises naming close matches
        ssh_public_key(self.ssh_key)
        if not MIN_IDLE_MINUTES <= self.idle_minutes <= MAX_IDLE_MINUTES:
            raise ValueError(f"{self.person}: idle_minutes: {MIN_IDLE_MINUTES}..{MAX_IDLE_MINUTES}")
        if dev_boxes.alarm_periods(self.idle_minutes) * dev_boxes.ALARM_PERIOD_SECONDS > dev_boxes.ALARM_MAX_SECONDS:
            raise ValueError(f"{self.person}: idle_minutes: the backstop alarm would evaluate more than a day")
        if self.vpn_groups and self.client_vpn_endpoint_id is None:
            raise ValueError(f"{self.person}: vpn_groups: the rules need client_vpn_endpoint_id")
        if self.uid <= 0:
            raise ValueError(f"{self.person}: uid: must be positive (never root), got {self.uid}")

    @property
    def variant(self) -> str:
        """The image variant of the type (as dev_boxes.plan): "gpu" for a GPU type, else "cpu"."""
        return "gpu" if instances.lookup(self.instance_type).gpus else "cpu"


def box_config(
    *, person: str, uid: int, ssh_key: str, file_system_id: str, access_point_id: str, region: str
) -> dict[str, Any]:
    """What the box's setup reads (chef/cookbooks/dlinfra_devbox), as the user data writes it: what makes the box
    the person's. The idle settings are not here but in the instance's tags (dev_boxes.idle_tags), so a new idle time
    changes a tag in place instead of the user data, which replaces the box."""
    return {
        "person": person,
        "uid": uid,
        "ssh_key": ssh_public_key(ssh_key),
        "home": {"file_system_id": file_system_id, "access_point_id": access_point_id, "region": region},
    }


def publish_verdict_policy() -> dict[str, object]:
    """The box's idle check may publish metrics in the dev boxes' namespace only (CloudWatch user guide, "Using
    condition keys to limit access to CloudWatch namespaces": PutMetricData has no resource, cloudwatch:namespace)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "PublishIdleVerdict",
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": dev_boxes.BUSY_NAMESPACE}},
            }
        ],
    }


def render_user_data(config: dict[str, Any]) -> str:
    """The box's cloud-config: its config file, then the setup the image carries (dlinfra_devbox::idle)."""
    text = _ENV.get_template("dev-box-user-data.yaml.j2").render(
        person=config["person"],
        config_path=CONFIG_PATH,
        config_json=json.dumps(config, indent=2, sort_keys=True),
        setup=SETUP_PATH,
    )
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"{config['person']}: user data is {len(text.encode())} bytes, over EC2's {USER_DATA_LIMIT}")
    return text


def home_mount_policy(file_system_arn: str, access_point_arn: str) -> dict[str, object]:
    """The box may mount and write the file system only through the person's access point, over a mount target
    (EFS guide, "Using IAM to control file system data access": ClientMount, ClientWrite; condition keys
    elasticfilesystem:AccessPointArn and AccessedViaMountTarget). No ClientRootAccess: the file system policy denies
    it to everyone anyway (components/efs_policy.py)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "MountOwnHome",
                "Effect": "Allow",
                "Action": [CLIENT_MOUNT, CLIENT_WRITE],
                "Resource": file_system_arn,
                "Condition": {
                    "StringEquals": {ACCESS_POINT_ARN: access_point_arn},
                    "Bool": {VIA_MOUNT_TARGET: "true"},
                },
            }
        ],
    }


class DevBox(pulumi.ComponentResource):
    """IAM role and instance profile, security group, the instance and its idle-stop alarm."""

    instance_id: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    private_dns: pulumi.Output[str]
    role_arn: pulumi.Output[str]
    security_group_id: pulumi.Output[str]

    def __init__(self, name: str, args: DevBoxArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:compute:DevBox", name, None, opts)
        names, person = args.names, args.person
        child = pulumi.ResourceOptions(parent=self)
        component = f"devbox-{person}"
        tags = names.tags(component, extra={dev_boxes.DEV_BOX_TAG: person})

        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical("devbox", person, max_len=64),
            assume_role_policy=service_trust("ec2.amazonaws.com"),
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicyAttachment(
            f"{name}-ssm", role=role.name, policy_arn=SSM_POLICY, opts=pulumi.ResourceOptions(parent=role)
        )
        aws.iam.RolePolicy(
            f"{name}-home",
            role=role.name,
            name="mount-own-home",
            policy=pulumi.Output.all(args.efs_file_system_arn, args.home_access_point_arn).apply(
                lambda arns: json.dumps(home_mount_policy(arns[0], arns[1]))
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        aws.iam.RolePolicy(
            f"{name}-verdict",
            role=role.name,
            name="publish-idle-verdict",
            policy=json.dumps(publish_verdict_policy()),
            opts=pulumi.ResourceOptions(parent=role),
        )
        profile = aws.iam.InstanceProfile(
            f"{name}-profile",
            name=names.physical("devbox", person, max_len=64),
            role=role.name,
            tags=tags,
            opts=child,
        )

        sg_name = names.physical("devbox", person)
        security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            name=sg_name,
            description=f"Dev box of {person}: SSH from the laptop VPN only",
            vpc_id=args.vpc_id,
            tags=names.tags(component, sg_name, extra={dev_boxes.DEV_BOX_TAG: person}),
            opts=child,
        )

        def rule(key: str, direction: sg.Direction, peer: sg.Peer, description: str, ports: tuple[int, int]) -> None:
            sg.rule(
                f"{name}-sg-{key}", direction, group=security_group, peer=peer, description=description,
                names=names, component=component, protocol="tcp", ports=ports,
            )  # fmt: skip

        # Client VPN translates laptops' addresses to its interface's in the associated subnet, which carries the
        # endpoint's security group (Client VPN admin guide, "How AWS Client VPN works": traffic from the endpoint
        # to the VPC is source-NATed; "Security groups": reference the endpoint's group in the target's rules). So
        # the rule names that group: laptops on this region's endpoint, nobody else in the VPC.
        rule(
            "ssh-from-laptops",
            "ingress",
            sg.Peer(security_group_id=args.laptop_security_group_id),
            "SSH from laptops on the Client VPN",
            (SSH_PORT, SSH_PORT),
        )
        world = sg.Peer(cidr="0.0.0.0/0")
        rule("to-https", "egress", world, "HTTPS: packages, model hubs, AWS endpoints", (443, 443))
        rule("to-http", "egress", world, "HTTP: package mirrors", (80, 80))
        rule("to-efs", "egress", sg.Peer(cidr=args.vpc_cidr), "NFS to the EFS mount targets", (NFS_PORT, NFS_PORT))

        config = pulumi.Output.all(args.efs_file_system_id, args.home_access_point_id).apply(
            lambda ids: render_user_data(
                box_config(
                    person=person,
                    uid=args.uid,
                    ssh_key=args.ssh_key,
                    file_system_id=ids[0],
                    access_point_id=ids[1],
                    region=names.region or "",
                )
            )
        )
        box_name = names.physical("devbox", person)
        # The image variant is part of the instance's name, so a change between a CPU and a GPU type makes a new
        # instance on the other image. An instance type change is otherwise an in-place stop and start (when the
        # architectures match: dlinfra/data/replacements.yaml), and even a replacement would keep the old image:
        # Pulumi replaces ignored inputs with their old values, on every update (pulumi/pulumi#2657, the engine
        # change that added ignoreChanges); only a resource with no state takes the program's value.
        instance = aws.ec2.Instance(
            f"{name}-{args.variant}-instance",
            ami=args.ami_id,
            instance_type=args.instance_type,
            subnet_id=args.subnet_id,
            vpc_security_group_ids=[security_group.id],
            associate_public_ip_address=False,
            iam_instance_profile=profile.name,
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=1,
                # The idle check reads the box's idle settings from its tags (dev_boxes.IDLE_TAGS). Every tag key of
                # the instance must then be one IMDS can serve, or the launch fails (rule instance-metadata-tag-keys).
                instance_metadata_tags="enabled",
            ),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_type="gp3",
                volume_size=args.root_volume_gib,
                iops=3000,
                throughput=250,
                encrypted=True,
                delete_on_termination=True,
                tags=names.tags(component, box_name, extra={dev_boxes.DEV_BOX_TAG: person}),
            ),
            # A poweroff on the box (the idle check) stops it: the root volume and its address stay (EC2 user guide,
            # "Change the instance initiated shutdown behavior").
            instance_initiated_shutdown_behavior="stop",
            # As the pools' launch templates: 1-minute metrics, and EBS optimization stated (the default on the
            # current types; it is ForceNew, so it is never left to drift).
            monitoring=True,
            ebs_optimized=True,
            # Not terminated by a stray console or CLI call; the provider lifts it before it deletes the box, so a
            # person removed from the fleet still loses theirs in the same apply (terraform-provider-aws
            # ec2/ec2_instance.go, resourceInstanceDelete).
            disable_api_termination=True,
            user_data=config,
            # A new key or home replaces the box: the setup runs on first boot only, and the home is on EFS.
            user_data_replace_on_change=True,
            # The idle settings: tags change in place, and the check reads them at every run.
            tags=names.tags(
                component, box_name, extra={dev_boxes.DEV_BOX_TAG: person, **dev_boxes.idle_tags(args.idle_minutes)}
            ),
            # A new image never reaches a running box by surprise: only a new instance (a new box, a variant change)
            # boots the current image (docs/dev-boxes.md, "The box").
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["ami"]),
        )

        # Client VPN authorizes a destination by its most specific rule (Client VPN admin guide, "Authorization
        # rules": with overlapping rules the longest prefix wins, for the groups it names). A rule for the box's /32
        # that names only the person's groups takes the box out of every other group's VPC-wide rule: other teams
        # (and the admins, who have Session Manager) cannot even reach its SSH port.
        box_cidr = instance.private_ip.apply(lambda ip: f"{ip}/32")
        for team, group in sorted(args.vpn_groups.items()):
            aws.ec2clientvpn.AuthorizationRule(
                f"{name}-authorize-{team}",
                client_vpn_endpoint_id=args.client_vpn_endpoint_id,
                target_network_cidr=box_cidr,
                access_group_id=group,
                description=f"{person}'s dev box: team {team} only",
                opts=child,
            )

        region = names.region or ""
        alarm_name = names.physical("devbox", person, "idle", max_len=255)
        periods = dev_boxes.alarm_periods(args.idle_minutes)
        aws.cloudwatch.MetricAlarm(
            f"{name}-idle-alarm",
            name=alarm_name,
            alarm_description=(
                f"Backstop of {person}'s dev box idle stop: its idle check reported idle for {args.idle_minutes} + "
                f"{dev_boxes.BACKSTOP_EXTRA_MINUTES} min and the box still runs: stop it"
            ),
            # The check's own verdict, not the CPU: a person connected and typing is busy to the check, whatever
            # the CPU shows. EC2 actions need a per-instance metric: a custom one qualifies with the InstanceId
            # dimension (CloudWatch user guide, "Create alarms to stop, terminate, reboot, or recover an EC2
            # instance"). The guide names no other kind, and the AWS CDK refuses EC2 actions on any alarm that is not
            # on one metric with an InstanceId dimension (aws-cdk alarm.ts, PR #29364): so no metric math here.
            namespace=dev_boxes.BUSY_NAMESPACE,
            metric_name=dev_boxes.BUSY_METRIC,
            dimensions={"InstanceId": instance.id},
            statistic="Maximum",  # any busy verdict in a period makes the period busy
            period=dev_boxes.ALARM_PERIOD_SECONDS,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            comparison_operator="LessThanThreshold",
            threshold=1,
            # No verdict is never idleness: a stopped box, a check that cannot publish, a box whose person is on it
            # while CloudWatch is unreachable. Only reported idleness stops the box.
            treat_missing_data="notBreaching",
            # AWS runs EC2 actions with the service-linked role AWSServiceRoleForCloudWatchEvents.
            alarm_actions=[f"arn:aws:automate:{region}:ec2:stop"],
            tags=names.tags(component, alarm_name, extra={dev_boxes.DEV_BOX_TAG: person}),
            opts=child,
        )

        self.instance_id = instance.id
        self.private_ip = instance.private_ip
        self.private_dns = instance.private_dns
        self.role_arn = role.arn
        self.security_group_id = security_group.id
        self.register_outputs(
            {
                "instance_id": self.instance_id,
                "private_ip": self.private_ip,
                "private_dns": self.private_dns,
                "role_arn": self.role_arn,
                "security_group_id": self.security_group_id,
            }
        )
