"""The storage plan: POSIX ids from names alone, access points per team and person, volumes per team namespace."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.team_volumes import volume_name
from dlinfra.errors import FleetError
from dlinfra.model import team_storage
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet, person_name
from tests.conftest import REFERENCE_FLEET


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


def test_ids_depend_on_the_name_alone() -> None:
    # Fixed values: a change of the scheme would change every directory's owner, so it must be seen in review.
    assert team_storage.posix_id("team", "vision") == 1369507504
    assert team_storage.posix_id("person", "alice") == 1992062792
    assert team_storage.posix_id("team", "alice") != team_storage.posix_id("person", "alice")


@pytest.mark.parametrize("kind", ["team", "person"])
def test_ids_lie_in_their_kinds_range_above_dynamic_provisioning(kind: team_storage.Kind) -> None:
    base = team_storage.ID_BASES[kind]
    for name in ("a1", "vision", "zz-top", "x.y_z"):
        uid = team_storage.posix_id(kind, name)
        assert base <= uid < base + 2**team_storage.ID_BITS <= 2**31
        assert uid > 7_000_000  # the EFS CSI driver's gidRangeEnd for dynamic access points


def test_the_plan_gives_every_team_and_person_an_access_point(fleet: Fleet) -> None:
    plan = team_storage.plan(fleet, "staging")
    assert set(plan.access_points) == {
        "datasets", "team-vision", "team-language", "team-robotics", "home-alice", "home-bob",
    }  # fmt: skip
    vision = plan.access_points["team-vision"]
    assert (vision.path, vision.uid, vision.gid, vision.permissions) == (
        "/teams/vision", team_storage.posix_id("team", "vision"), team_storage.posix_id("team", "vision"), "0770",
    )  # fmt: skip
    assert plan.access_points["home-alice"].permissions == "0700"
    assert plan.team_access_points("vision") == ("datasets", "home-alice", "team-vision")
    assert plan.team_access_points("robotics") == ("datasets", "team-robotics")
    assert {v.claim for v in plan.volumes if v.read_only} == {"datasets"}
    assert plan.s3_prefixes == {t: f"teams/{t}/" for t in fleet.teams}


def test_people_are_the_vpn_users_and_the_team_members(fleet: Fleet) -> None:
    assert team_storage.people(fleet, "staging") == ("alice", "bob")  # certificate users, also members
    assert team_storage.people(fleet, "prod") == ("alice", "bob")  # prod signs in by SAML: the members


def _shuffled(fleet: Fleet, seed: int) -> Fleet:
    data: dict[str, Any] = fleet.model_dump(mode="json", exclude_none=True)
    rng = random.Random(seed)
    teams = list(data["teams"].items())
    rng.shuffle(teams)
    for _, team in teams:
        rng.shuffle(team["members"])
    data["teams"] = dict(teams)
    for env in data["environments"].values():
        if env.get("client_vpn", {}).get("users"):
            rng.shuffle(env["client_vpn"]["users"])
    return Fleet.model_validate(data)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reordering_teams_members_and_users_changes_nothing(fleet: Fleet, seed: int) -> None:
    extended = fleet.model_copy(
        update={
            "teams": {
                **fleet.teams,
                "vision": fleet.teams["vision"].model_copy(update={"members": ("carol", "alice", "dan")}),
            }
        }
    )
    for env in fleet.environments:
        assert team_storage.plan(_shuffled(extended, seed), env) == team_storage.plan(extended, env)


def test_adding_a_team_changes_no_other_teams_id(fleet: Fleet) -> None:
    before = team_storage.plan(fleet, "prod").access_points
    teams = {"aaa": fleet.teams["vision"].model_copy(update={"members": ()}), **fleet.teams}
    after = team_storage.plan(fleet.model_copy(update={"teams": teams}), "prod").access_points
    assert {k: v for k, v in after.items() if k != "team-aaa"} == before


def test_colliding_ids_are_refused_naming_file_line_and_key(
    write_fleet: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(team_storage, "posix_id", lambda kind, name: 7 if name in ("language", "vision") else 9)
    with pytest.raises(FleetError) as err:
        load_fleet(write_fleet())
    assert err.value.key == "teams.vision"
    assert "team 'vision' and team 'language' get the same POSIX id" in str(err.value)
    assert ":" in str(err.value.file)  # file:line


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (["Alice"], "is not a user name"),
        (["alice", "alice"], "lists a person twice"),
        # The claim home-<person> and its volume home-<person>-<namespace> must be DNS-1123 subdomains.
        (["john_doe"], "'john_doe' is not a user name Kubernetes can use in the claim home-john_doe"),
        (["john-"], "'john-' is not a user name"),
        (["john."], "'john.' is not a user name"),
        (["john.-doe"], "'john.-doe' is not a user name"),
        (["john..doe"], "'john..doe' is not a user name"),
        (["a" * 64], "is not a user name"),
    ],
)
def test_bad_members_are_refused(write_fleet: Callable[..., Path], members: list[str], message: str) -> None:
    def change(data: dict[str, Any]) -> None:
        data["teams"]["vision"]["members"] = members

    with pytest.raises(FleetError, match=message):
        load_fleet(write_fleet(change))


@pytest.mark.parametrize("where", ["members", "users"])
def test_a_name_kubernetes_refuses_is_named_with_its_file_line_and_key(
    write_fleet: Callable[..., Path], where: str
) -> None:
    """Team members and laptop-VPN users alike: the error names the entry's own line and key."""
    text = REFERENCE_FLEET.read_text()
    if where == "members":
        text = text.replace("members: [bob]", "members:\n      - bob\n      - john_doe", 1)
        key = "teams.language.members.1"
    else:
        text = text.replace("users: [alice, bob]", "users:\n        - alice\n        - john_doe", 1)
        key = "environments.staging.client_vpn.users.1"
    assert "- john_doe" in text
    path = write_fleet(text=text)
    line = text.splitlines().index(next(s for s in text.splitlines() if s.strip() == "- john_doe")) + 1
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert f"fleet.yaml:{line}: {key}: 'john_doe' is not a user name Kubernetes can use" in str(err.value)
    assert err.value.key == key


# Kubernetes' DNS-1123 subdomain, as its docs "Object Names and IDs" state it (written here, not taken from the
# schema, so the two are checked against each other).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


@settings(max_examples=500, derandomize=True)
@given(st.text(alphabet="abcz019._-", min_size=1, max_size=70))
def test_a_person_is_accepted_exactly_when_kubernetes_takes_their_claim_and_volume(person: str) -> None:
    claim = f"{team_storage.HOME_CLAIM_PREFIX}{person}"
    names = (claim, volume_name(claim, "team-vision"))
    kubernetes_takes = all(DNS_SUBDOMAIN.fullmatch(n) and len(n) <= 253 for n in names)
    try:
        person_name(person)
        accepted = True
    except ValueError:
        accepted = False
    # The schema is stricter in two ways only: a person starts with a letter and has at most 63 characters.
    assert accepted == (kubernetes_takes and person[0].isalpha() and len(person) <= 63), (person, names)
