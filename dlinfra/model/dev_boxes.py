"""Dev boxes planned from the fleet (pure): each person's box with its region, zone, image variant, login identity,
home access point and idle settings, and the checks that tie a box to the rest of the fleet.

A box is an EC2 instance, not a pod on the interactive pool (docs/dev-boxes.md, "Instances, not pods"). Its login user
has the uid of the person's EFS home access point (dlinfra.model.team_storage.posix_id), so the files the person
writes at home are theirs on the box, in their pods and in every region.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlinfra.errors import FleetError
from dlinfra.model import instances, team_storage
from dlinfra.model.fleet.schema import Fleet

# The on-box idle check runs this often (systemd timer OnUnitActiveSec), in seconds.
CHECK_INTERVAL_SECONDS = 300
# What keeps a box busy at a check, whoever is logged in (chef/cookbooks/dlinfra_devbox/files/devbox_idle.py): an SSH
# or SSM session; a GPU at or over IDLE_GPU_PERCENT; a 5-minute load average at or over IDLE_LOAD, whatever the number
# of vCPUs (one single-threaded job gives a load of 1.0 on a box of any size); and any process of a person (a uid from
# 1000, login.defs UID_MIN, or a process started from a login, even under sudo: its loginuid) that is running or in
# I/O wait now, or that used IDLE_CPU_SECONDS of CPU or moved IDLE_IO_BYTES since the last check. So a script left
# running in screen or tmux keeps the box, while a detached tmux with only a shell in it does not.
IDLE_GPU_PERCENT = 5
IDLE_LOAD = 0.5
IDLE_CPU_SECONDS = 3.0  # 1% of one CPU over a 5-minute check
IDLE_IO_BYTES = 1 << 20  # 1 MiB read or written (rchar + wchar of /proc/<pid>/io) since the last check
# The box carries its idle settings as instance tags, read by the check through the instance metadata service (IMDS
# tags: metadata_options.instance_metadata_tags "enabled"; EC2 user guide, "View tags for your EC2 instances using
# instance metadata"). Tags change in place and reach a running box at once, so a new idle time neither replaces nor
# restarts it; the user data (which would replace the box) carries none of them.
IDLE_TAGS = {
    "minutes": "dlinfra:idle-minutes",
    "gpu_percent": "dlinfra:idle-gpu-percent",
    "load": "dlinfra:idle-load",
    "cpu_seconds": "dlinfra:idle-cpu-seconds",
    "io_bytes": "dlinfra:idle-io-bytes",
}
# The backstop: the check publishes its verdict at every run, as the custom metric BUSY_METRIC (1 busy, 0 idle) in
# BUSY_NAMESPACE with the dimension InstanceId. A CloudWatch alarm stops the box when it has reported idle in every
# alarm period of the idle time plus BACKSTOP_EXTRA_MINUTES: the check said idle but the box did not power off
# (a failed poweroff, a hung unit). A check that reports nothing at all stops nothing (see the alarm in
# components/dev_box.py): no verdict must never stop a person at work. EC2 actions are allowed on custom metrics that
# carry the InstanceId dimension (CloudWatch user guide, "Create alarms to stop, terminate, reboot, or recover an EC2
# instance"). Nothing a person does on the box can look idle to it: the verdict is the check's, which counts a
# session as busy.
BUSY_NAMESPACE = "dlinfra/DevBox"
BUSY_METRIC = "Busy"
# Two check intervals: the timer runs a check every CHECK_INTERVAL_SECONDS after the last one ended (plus up to its
# AccuracySec), so a 5-minute period could hold no verdict at all, and the alarm (missing data: not breaching, every
# period must breach) would never act. Every 10-minute period holds at least one verdict of a working check.
ALARM_PERIOD_SECONDS = 2 * CHECK_INTERVAL_SECONDS
BACKSTOP_EXTRA_MINUTES = 60
# CloudWatch: Period x EvaluationPeriods <= 86,400 s (PutMetricAlarm).
ALARM_MAX_SECONDS = 86400
# The login user is the person's name: useradd and groupadd refuse names longer than utmp's ut_user, 32 on Linux
# (shadow-utils libmisc/chkname.c). The fleet's person names (schema.person_name) allow 63; their characters are
# already ones useradd takes.
MAX_PERSON_NAME = 32
DEV_BOX_TAG = "dlinfra:dev-box"  # on the instance, its security group and alarm: the person the box is for


@dataclass(frozen=True)
class DevBoxPlan:
    """One person's box, as the components need it."""

    person: str
    environment: str
    region: str
    zone: str  # AZ name
    instance_type: str
    variant: str  # image variant: "gpu" for a GPU type, else "cpu" (dlinfra.model.images.VARIANTS)
    uid: int  # the login user's uid and gid: the home access point's (team_storage.posix_id)
    home_access_point: str  # key of the person's access point in team_storage.plan
    ssh_key: str  # `<type> <base64>`
    idle_minutes: int
    root_volume_gib: int
    # SAML: the IdP groups (by team) through which the person reaches the box, and only they: a Client VPN
    # authorization rule for the box's address names them. {} for certificate sign-in, which carries no group.
    vpn_groups: dict[str, str]

    @property
    def gpus(self) -> int:
        return instances.lookup(self.instance_type).gpus


def alarm_periods(idle_minutes: int) -> int:
    """Evaluation periods of the CloudWatch backstop: the idle time plus the margin, in alarm periods."""
    return math.ceil((idle_minutes + BACKSTOP_EXTRA_MINUTES) * 60 / ALARM_PERIOD_SECONDS)


def idle_tags(idle_minutes: int) -> dict[str, str]:
    """The instance tags that carry a box's idle settings to its check (IDLE_TAGS)."""
    values = {
        "minutes": str(idle_minutes),
        "gpu_percent": f"{IDLE_GPU_PERCENT:g}",
        "load": f"{IDLE_LOAD:g}",
        "cpu_seconds": f"{IDLE_CPU_SECONDS:g}",
        "io_bytes": str(IDLE_IO_BYTES),
    }
    return {IDLE_TAGS[k]: v for k, v in values.items()}


def vpn_groups(fleet: Fleet, env: str, person: str) -> dict[str, str] | None:
    """The IdP groups, by team, that let a person onto the environment's VPN (SAML: their teams' groups), {} for a
    certificate user, or None when the person cannot connect at all."""
    spec = fleet.environments[env].client_vpn
    if spec is None:
        return None
    if spec.saml is None:
        return {} if person in spec.users else None
    groups = {name: t.vpn_group for name, t in sorted(fleet.teams.items()) if person in t.members and t.vpn_group}
    return groups or None


def plan(fleet: Fleet, env: str) -> dict[str, DevBoxPlan]:
    """Every box of an environment, by person (sorted); assumes check_fleet passed."""
    section = fleet.environments[env].dev_boxes
    out = {}
    for person, box in section.people.items():
        out[person] = DevBoxPlan(
            person=person,
            environment=env,
            region=box.region,
            zone=box.zone or fleet.azs(box.region)[0],
            instance_type=box.instance_type,
            variant="gpu" if instances.lookup(box.instance_type).gpus else "cpu",
            uid=team_storage.posix_id("person", person),
            home_access_point=team_storage.home_access_point_key(person),
            ssh_key=box.ssh_key,
            idle_minutes=box.idle_minutes or section.idle_minutes,
            root_volume_gib=box.root_volume_gib,
            vpn_groups=vpn_groups(fleet, env, person) or {},
        )
    return out


def boxes_in(fleet: Fleet, env: str, region: str) -> dict[str, DevBoxPlan]:
    """The boxes of an environment that run in one region, by person."""
    return {p: b for p, b in plan(fleet, env).items() if b.region == region}


def check_fleet(fleet: Fleet) -> None:
    """Refuse a box for a name that cannot be a login, a box nobody could reach, in a region or zone the environment
    lacks, or of a type not sold there."""
    for env_name, env in fleet.environments.items():
        for person, box in env.dev_boxes.people.items():
            key = f"environments.{env_name}.dev_boxes.people.{person}"
            if len(person) > MAX_PERSON_NAME:
                raise FleetError(
                    f"{person!r} is {len(person)} characters, too long for a login on the box (useradd takes at most "
                    f"{MAX_PERSON_NAME}): give this person a shorter name in the fleet",
                    key=key,
                )
            if env.client_vpn is None:
                raise FleetError(
                    f"{env_name} has no laptop VPN (client_vpn), the only way in to a dev box: add one", key=key
                )
            if vpn_groups(fleet, env_name, person) is None:
                who = (
                    "a member of a team with a vpn_group (teams.<team>.members)"
                    if env.client_vpn.saml is not None
                    else f"a VPN user (environments.{env_name}.client_vpn.users)"
                )
                raise FleetError(f"{person!r} cannot connect to {env_name}'s laptop VPN: make them {who}", key=key)
            if box.region not in env.regions:
                raise FleetError(
                    f"{box.region!r} is not a region of {env_name} ({', '.join(env.regions)})", key=f"{key}.region"
                )
            try:
                spec = instances.lookup(box.instance_type)
            except instances.UnknownInstanceType as exc:
                raise FleetError(exc.detail, key=f"{key}.instance_type") from None
            if not instances.offered(spec.name, box.region):
                raise FleetError(f"{spec.name} is not sold in {box.region}", key=f"{key}.instance_type")
            if box.zone is not None and box.zone not in fleet.azs(box.region):
                raise FleetError(
                    f"{box.zone!r} is not one of the AZs the fleet uses in {box.region} "
                    f"({', '.join(fleet.azs(box.region))})",
                    key=f"{key}.zone",
                )
