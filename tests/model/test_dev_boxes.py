"""Dev boxes in the fleet: OpenSSH keys read and judged, a box tied to its environment's VPN people, regions, zones and
instance types, and the plan the components get (uid, image variant, VPN groups, idle time)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from dlinfra.model import dev_boxes, team_storage
from dlinfra.model.fleet.devboxes import MAX_IDLE_MINUTES, ssh_public_key
from dlinfra.model.fleet.load import load_fleet
from tests import reference


def openssh(key: Any) -> str:
    """The public half of a private key, as the line of its .pub file."""
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


ED25519 = openssh(ed25519.Ed25519PrivateKey.generate())
ECDSA = openssh(ec.generate_private_key(ec.SECP384R1()))
RSA_3072 = openssh(rsa.generate_private_key(public_exponent=65537, key_size=3072))
RSA_2048 = openssh(rsa.generate_private_key(public_exponent=65537, key_size=2048))


@pytest.mark.parametrize("key", [ED25519, ECDSA, RSA_3072], ids=["ed25519", "ecdsa-p384", "rsa-3072"])
def test_accepted_keys_lose_only_their_comment(key: str) -> None:
    assert ssh_public_key(f"{key} someone@laptop") == key
    assert ssh_public_key(f"  {key}\n") == key


def _blob_of(kind: str, *fields: bytes) -> str:
    data = b"".join(len(f).to_bytes(4, "big") + f for f in (kind.encode(), *fields))
    return base64.b64encode(data).decode()


TRUNCATED = base64.b64encode(bytes([0, 0, 0, 32]) + b"ab").decode()  # says 32 bytes follow, holds 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (RSA_2048, "an RSA key of 2048 bits is too weak"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "key type 'ssh-dss' is not accepted"),
        ("ssh-ed25519", "not an OpenSSH public key"),
        ("ssh-ed25519 not-base64!", "does not decode"),
        (f"ssh-ed25519 {ECDSA.split()[1]}", "the key's data says ecdsa-sha2-nistp384, not ssh-ed25519"),
        (f"ssh-ed25519 {_blob_of('ssh-ed25519', b'short')}", "must hold one 32-byte key"),
        (f"ecdsa-sha2-nistp256 {ECDSA.split()[1]}", "the key's data says ecdsa-sha2-nistp384"),
        (f"ssh-ed25519 {TRUNCATED}", "cut short"),
    ],
    ids=["rsa-2048", "dsa", "no-data", "bad-base64", "type-mismatch", "short-ed25519", "curve-mismatch", "truncated"],
)
def test_refused_keys_say_why(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ssh_public_key(line)


def _box(**changes: Any) -> dict[str, Any]:
    return {"region": "us-west-2", "instance_type": "g6.xlarge", "ssh_key": ED25519, **changes}


def _prod_box(person: str = "alice", **changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["environments"]["prod"]["dev_boxes"]["people"][person] = _box(**changes)

    return change


def _no_vpn(data: dict[str, Any]) -> None:
    data["environments"]["staging"]["client_vpn"] = None


BOXES = "environments.prod.dev_boxes.people"
LONG = "alexandra.konstantinopoulou-smith"  # 33 characters: a fine fleet name (up to 63), not a login


def _long_name(data: dict[str, Any]) -> None:
    data["teams"]["vision"]["members"].append(LONG)
    _prod_box(LONG)(data)


BAD: list[Any] = [
    pytest.param(
        _prod_box("carol"), f"{BOXES}.carol", "'carol' cannot connect to prod's laptop VPN", id="not-a-member"
    ),
    pytest.param(
        lambda d: d["environments"]["staging"]["dev_boxes"]["people"].update(carol=_box()),
        "environments.staging.dev_boxes.people.carol",
        "make them a VPN user (environments.staging.client_vpn.users)",
        id="not-a-vpn-user",
    ),
    pytest.param(_no_vpn, "environments.staging.dev_boxes.people.bob", "staging has no laptop VPN", id="no-vpn"),
    pytest.param(
        _prod_box(region="ap-south-1"),
        f"{BOXES}.alice.region",
        "'ap-south-1' is not a region of prod",
        id="region-elsewhere",
    ),
    pytest.param(
        _prod_box(region="eu-west-1"),
        f"{BOXES}.alice.instance_type",
        "g6.xlarge is not sold in eu-west-1",
        id="type-not-sold",
    ),
    pytest.param(
        _prod_box(instance_type="g6.xlarg"), f"{BOXES}.alice.instance_type", "did you mean g6.xlarge", id="unknown-type"
    ),
    pytest.param(
        _prod_box(zone="us-west-2d"), f"{BOXES}.alice.zone", "'us-west-2d' is not one of the AZs", id="zone-unused"
    ),
    pytest.param(_prod_box(ssh_key=RSA_2048), f"{BOXES}.alice.ssh_key", "too weak", id="weak-key"),
    pytest.param(
        _prod_box(idle_minutes=5), f"{BOXES}.alice.idle_minutes", "greater than or equal to 15", id="idle-too-short"
    ),
    pytest.param(
        _prod_box(idle_minutes=MAX_IDLE_MINUTES + 1),
        f"{BOXES}.alice.idle_minutes",
        "less than or equal",
        id="idle-past-a-day",
    ),
    pytest.param(_prod_box(gpus=1), f"{BOXES}.alice.gpus", "unknown key", id="unknown-key"),
    pytest.param(
        _long_name, f"{BOXES}.{LONG}", "too long for a login on the box (useradd takes at most 32)", id="long-name"
    ),
]


@pytest.mark.parametrize(("change", "key", "message"), BAD)
def test_a_bad_box_is_refused_naming_file_and_key(
    fleet_error: Callable[..., str], change: Any, key: str, message: str
) -> None:
    text = fleet_error(change)
    assert key in text and message in text, text


def test_the_plan_gives_each_box_its_person_home_image_and_groups() -> None:
    fleet = reference.fleet()
    alice = dev_boxes.plan(fleet, "prod")["alice"]
    assert alice.uid == team_storage.posix_id("person", "alice")
    assert alice.home_access_point in team_storage.plan(fleet, "prod").access_points
    assert (alice.variant, alice.gpus, alice.zone, alice.idle_minutes) == ("gpu", 1, "us-west-2a", 60)
    assert alice.vpn_groups == {"vision": fleet.teams["vision"].vpn_group}  # federated: her team's group only
    bob = dev_boxes.plan(fleet, "staging")["bob"]
    assert (bob.variant, bob.gpus, bob.zone, bob.idle_minutes, bob.vpn_groups) == ("cpu", 0, "us-west-2b", 30, {})
    assert dev_boxes.boxes_in(fleet, "prod", "us-east-1") == {}
    # A person's box changes with nothing of anyone else's: the comment of a key is not part of it.
    assert " " not in alice.ssh_key.split(" ", 1)[1]


def test_the_backstop_alarm_fits_cloudwatchs_day() -> None:
    # The longest idle time the fleet accepts still evaluates within PutMetricAlarm's one day.
    periods = dev_boxes.alarm_periods(MAX_IDLE_MINUTES)
    assert periods * dev_boxes.ALARM_PERIOD_SECONDS == dev_boxes.ALARM_MAX_SECONDS
    assert dev_boxes.alarm_periods(60) == 12  # 60 + 60 minutes in 10-minute periods
    # Every period holds a verdict of a working check, which runs every 5 minutes (plus its run time and slack).
    assert dev_boxes.ALARM_PERIOD_SECONDS >= 2 * dev_boxes.CHECK_INTERVAL_SECONDS


def test_a_32_character_name_is_a_fine_login(write_fleet: Callable[..., Path]) -> None:
    name = LONG[:32]

    def change(data: dict[str, Any]) -> None:
        data["teams"]["vision"]["members"].append(name)
        _prod_box(name)(data)

    assert name in load_fleet(write_fleet(change)).fleet.environments["prod"].dev_boxes.people


def test_people_order_changes_nothing(write_fleet: Callable[..., Path]) -> None:
    def both(data: dict[str, Any]) -> None:
        people = data["environments"]["prod"]["dev_boxes"]["people"]
        people["bob"] = _box(instance_type="m7i.2xlarge", ssh_key=ECDSA)
        data["environments"]["prod"]["dev_boxes"]["people"] = dict(reversed(list(people.items())))

    fleet = load_fleet(write_fleet(both)).fleet
    assert list(fleet.environments["prod"].dev_boxes.people) == ["alice", "bob"]
    assert list(dev_boxes.plan(fleet, "prod")) == ["alice", "bob"]
