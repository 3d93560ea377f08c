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
# Below this 5-minute load average per vCPU, and this GPU utilization (percent, every GPU), a box counts as idle
# when nobody is logged in: a job left running in screen or tmux keeps it busy.
IDLE_LOAD_PER_CPU = 0.1
IDLE_GPU_PERCENT = 5
# The CloudWatch backstop: EC2's CPUUtilization in 5-minute periods (basic monitoring publishes every 5 minutes: EC2
# user guide, "Instance metrics"), below this percent for the idle time plus BACKSTOP_EXTRA_MINUTES. It acts only
# when the on-box check did not (a broken image, a hung check); the margin lets the check act first.
ALARM_PERIOD_SECONDS = 300
ALARM_CPU_PERCENT = 2.0
BACKSTOP_EXTRA_MINUTES = 60
# CloudWatch: Period x EvaluationPeriods <= 86,400 s (PutMetricAlarm).
ALARM_MAX_SECONDS = 86400
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
    """Refuse a box nobody could reach, in a region or zone the environment lacks, or of a type not sold there."""
    for env_name, env in fleet.environments.items():
        for person, box in env.dev_boxes.people.items():
            key = f"environments.{env_name}.dev_boxes.people.{person}"
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
