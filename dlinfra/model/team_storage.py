"""Who may use which shared directory and bucket prefix: EFS access points per team and person, each with a POSIX
identity derived from its name, the volumes that bind them into team namespaces, and S3 prefixes per team (pure).

POSIX identities (docs/access.md, "Storage"): an access point enforces one user and group on every request made
through it (EFS guide, "Enforcing a user identity using an access point"), so the files a team or person writes are
owned by that identity wherever they are mounted. The id comes from the name alone, never from a position in the
fleet file: `posix_id("team", "vision")` is `base + sha256("dlinfra/team/vision") mod 2**29` with teams in
[2**30, 2**30 + 2**29) and people in [2**30 + 2**29, 2**31). Reordering, adding or removing an entry changes no
other entry's id. Both ranges lie above the EFS CSI driver's dynamic-provisioning range (gidRangeStart 50000 to
gidRangeEnd 7000000, aws-efs-csi-driver docs/parameters.md) and below 2**31, which tools with a signed 32-bit uid
still read. Two names of a kind whose ids collide are refused (`check_fleet`), naming both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from dlinfra.errors import FleetError
from dlinfra.model.fleet.schema import Fleet

Kind = Literal["team", "person"]
ID_BITS = 29
ID_BASES: dict[Kind, int] = {"team": 2**30, "person": 2**30 + 2**ID_BITS}
# The datasets access point keeps the identity it was first declared with: its files are already owned by it.
DATASETS_ID = 1000
DATASETS = "datasets"  # access point key and claim name of the shared, read-only datasets
TEAM_CLAIM = "team"  # claim name of a team's own directory in its namespace
HOME_CLAIM_PREFIX = "home-"  # claim name of a member's home in the team's namespace: home-<person>
# S3: each team owns this prefix in every data bucket (components/storage.py BUCKETS) and reads all of datasets.
S3_TEAM_PREFIX = "teams/{team}/"


def posix_id(kind: Kind, name: str) -> int:
    """The uid (and gid) of a team's or a person's access point: a function of the name alone."""
    digest = hashlib.sha256(f"dlinfra/{kind}/{name}".encode()).digest()
    offset: int = int.from_bytes(digest[:8], "big") % 2**ID_BITS
    return ID_BASES[kind] + offset


@dataclass(frozen=True)
class AccessPoint:
    """One EFS access point: its root directory, created with the enforced identity as owner."""

    key: str  # stable name: "datasets", "team-<team>" or "home-<person>" (the logical name's suffix)
    path: str  # root directory on the file system
    uid: int  # enforced POSIX user, and owner of the root directory
    gid: int  # enforced POSIX group, and group of the root directory
    permissions: str  # octal mode the root directory is created with
    owner: str  # "shared", "team <team>" or "person <person>" (for reviewers and `dlinfra access`)


@dataclass(frozen=True)
class Volume:
    """A static PersistentVolume onto one access point, reserved for one claim in one team's namespace."""

    team: str
    claim: str  # PersistentVolumeClaim name in the team's namespace
    access_point: str  # AccessPoint.key
    read_only: bool


@dataclass(frozen=True)
class StoragePlan:
    """An environment's access points, the volumes that bind them into team namespaces, and S3 prefixes."""

    access_points: dict[str, AccessPoint]  # by key, sorted
    volumes: tuple[Volume, ...]  # sorted by team, then claim
    s3_prefixes: dict[str, str]  # team -> its key prefix in every data bucket

    def team_access_points(self, team: str) -> tuple[str, ...]:
        """Keys of the access points a team's namespace may mount (any access)."""
        return tuple(sorted({v.access_point for v in self.volumes if v.team == team}))


def people(fleet: Fleet, env: str) -> tuple[str, ...]:
    """Everyone with a home in an environment: its laptop-VPN certificate users and every team's members."""
    spec = fleet.environments[env].client_vpn
    named = set(spec.users if spec is not None else ())
    for team in fleet.teams.values():
        named.update(team.members)
    return tuple(sorted(named))


def team_access_point_key(team: str) -> str:
    return f"team-{team}"


def home_access_point_key(person: str) -> str:
    return f"home-{person}"


def plan(fleet: Fleet, env: str) -> StoragePlan:
    """The environment's storage plan; every regional stack of it declares the same access points."""
    points = [AccessPoint(DATASETS, "/datasets", DATASETS_ID, DATASETS_ID, "0775", "shared")]
    volumes: list[Volume] = []
    for team in sorted(fleet.teams):
        team_id = posix_id("team", team)
        key = team_access_point_key(team)
        points.append(AccessPoint(key, f"/teams/{team}", team_id, team_id, "0770", f"team {team}"))
        volumes.append(Volume(team, DATASETS, DATASETS, read_only=True))
        volumes.append(Volume(team, TEAM_CLAIM, key, read_only=False))
        for person in sorted(fleet.teams[team].members):
            volumes.append(Volume(team, f"{HOME_CLAIM_PREFIX}{person}", home_access_point_key(person), False))
    for person in people(fleet, env):
        person_id = posix_id("person", person)
        key = home_access_point_key(person)
        points.append(AccessPoint(key, f"/home/{person}", person_id, person_id, "0700", f"person {person}"))
    return StoragePlan(
        access_points={p.key: p for p in sorted(points, key=lambda p: p.key)},
        volumes=tuple(sorted(volumes, key=lambda v: (v.team, v.claim))),
        s3_prefixes={team: S3_TEAM_PREFIX.format(team=team) for team in sorted(fleet.teams)},
    )


def check_fleet(fleet: Fleet) -> None:
    """Refuse two teams, or two people, whose names give the same POSIX id (one would read the other's files)."""
    names: dict[Kind, dict[str, str]] = {
        "team": {team: f"teams.{team}" for team in fleet.teams},
        "person": {},
    }
    for env_name, env in fleet.environments.items():
        for person in env.client_vpn.users if env.client_vpn is not None else ():
            names["person"].setdefault(person, f"environments.{env_name}.client_vpn.users")
    for team_name, team in fleet.teams.items():
        for person in team.members:
            names["person"].setdefault(person, f"teams.{team_name}.members")
    for kind, keyed in names.items():
        seen: dict[int, str] = {}
        for name in sorted(keyed):
            uid = posix_id(kind, name)
            if uid in seen:
                raise FleetError(
                    f"{kind} {name!r} and {kind} {seen[uid]!r} get the same POSIX id {uid} (derived from the "
                    "names): rename one",
                    key=keyed[name],
                )
            seen[uid] = name
