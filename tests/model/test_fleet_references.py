"""Every place one fleet value names another is checked by `validate`: a zone in its region, a region of the fleet
and of the environment, a site's environment, a team's overflow regions, IAM roles and IdP groups that must be
one entry's own. A fleet `validate` accepts previews without a bare exception."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dlinfra.errors import FleetError
from dlinfra.model import instances, planner, stackroles
from dlinfra.model.fleet.load import load_fleet, validate_data
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.regions import known_regions
from tests.conftest import REFERENCE_LOCK, ROOT
from tests.model.test_fleet import _set

Change = Callable[[dict[str, Any]], None]

PROD_POOLS = "environments.prod.node_pools"
ADMIN_ROLE = "arn:aws:iam::111122223333:role/infra-admin"
PREVIEW_ROLE = "arn:aws:iam::111122223333:role/dlinfra-preview"
ADMIN_GROUP = "4a7b3c2d-1111-4e5f-9a8b-infra-admins"
VISION_GROUP = "4a7b3c2d-2222-4e5f-9a8b-team-vision"


def _all(*changes: Change) -> Change:
    def change(data: dict[str, Any]) -> None:
        for one in changes:
            one(data)

    return change


# One case per cross-reference: (change, key named, words of the message).
CROSS_REFERENCES = [
    pytest.param(
        _set("environments.staging.regions.ap-south-1", {"transit_asn": 64521}),
        "environments.staging.regions.ap-south-1",
        "region 'ap-south-1' is not in the fleet's regions",
        id="environment-region-not-in-the-fleet",
    ),
    pytest.param(
        _set("environments.staging.node_pools.cpu.regions", ["us-east-1"]),
        "environments.staging.node_pools.cpu.regions",
        "region 'us-east-1' is not a region of environment 'staging'",
        id="pool-region-not-in-its-environment",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.train-a100.zones", {"us-west-2": ["us-west-2a"]}),
        f"{PROD_POOLS}.train-a100.zones.us-west-2",
        "pool does not run in 'us-west-2'",
        id="pool-zones-of-a-region-the-pool-is-not-in",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.interactive.zones", {"us-west-2": ["us-east-1a"]}),
        f"{PROD_POOLS}.interactive.zones.us-west-2",
        "us-east-1a is an AZ of us-east-1, not of us-west-2",
        id="pool-zone-of-another-region",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.interactive.zones", {"us-west-2": ["us-west-2d"]}),
        f"{PROD_POOLS}.interactive.zones.us-west-2",
        "us-west-2d is not among the 3 AZs the fleet uses in us-west-2 (us-west-2a, us-west-2b, us-west-2c)",
        id="pool-zone-beyond-the-regions-azs",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.interactive.zones", {"us-west-2": ["us-west-2z"]}),
        f"{PROD_POOLS}.interactive.zones.us-west-2",
        "us-west-2z is not an AZ of us-west-2",
        id="pool-zone-that-is-no-zone",
    ),
    pytest.param(
        _set(
            f"{PROD_POOLS}.train-h100.capacity_reservations.eu-west-1",
            {"id": "cr-0a1b2c3d4e5f60719", "zone_id": "euw1-az1"},
        ),
        f"{PROD_POOLS}.train-h100.capacity_reservations.eu-west-1",
        "pool does not run in 'eu-west-1'",
        id="reservation-in-a-region-the-pool-is-not-in",
    ),
    pytest.param(
        # The bug: validate and cidr --update passed a zone of another region, and preview stopped with a KeyError.
        _set(f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id", "use1-az1"),
        f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id",
        "reservation cr-0a1b2c3d4e5f60718: use1-az1 is not a zone of us-west-2: it is a zone of us-east-1",
        id="reservation-zone-of-another-region",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id", "usw2-az4"),
        f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id",
        "not among the zones the fleet uses in us-west-2",
        id="reservation-zone-beyond-the-regions-azs",
    ),
    pytest.param(
        _set(f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id", "usw2-az9"),
        f"{PROD_POOLS}.train-h100.capacity_reservations.us-west-2.zone_id",
        "usw2-az9 is not a zone of us-west-2",
        id="reservation-zone-that-is-no-zone",
    ),
    pytest.param(
        _set("sites.sjc1.environment", "dev"),
        "sites.sjc1.environment",
        "unknown environment 'dev'",
        id="site-environment-unknown",
    ),
    pytest.param(
        _set("sites.ams1.environment", "staging"),
        "sites.ams1.region",
        "home region 'eu-west-1' is not a region of environment 'staging' (us-west-2)",
        id="site-region-not-in-its-environment",
    ),
    pytest.param(
        _all(_set("regions.ap-south-1", {"azs": 2}), _set("teams.vision.overflow", ["ap-south-1"])),
        "teams.vision.overflow",
        "ap-south-1 is in no environment's regions: there is no cluster there for jobs to overflow to",
        id="overflow-to-a-region-without-a-cluster",
    ),
    pytest.param(
        _set("teams.vision.role_arn", ADMIN_ROLE),
        "teams.vision.role_arn",
        f"{ADMIN_ROLE} is also in environments.prod.kubernetes.admin_role_arns: EKS gives an IAM principal one "
        "access entry per cluster",
        id="team-role-is-an-admin-role",
    ),
    pytest.param(
        _set("teams.vision.role_arn", PREVIEW_ROLE),
        "teams.vision.role_arn",
        f"{PREVIEW_ROLE} is also environments.prod.ci.preview_role_arn",
        id="team-role-is-a-ci-role",
    ),
    pytest.param(
        _set("teams.robotics.role_arn", "arn:aws:iam::111122223333:role/team-vision"),
        "teams.robotics.role_arn",
        "arn:aws:iam::111122223333:role/team-vision is also team vision's role",
        id="team-role-is-another-teams",
    ),
    pytest.param(
        _set("teams.robotics.vpn_group", VISION_GROUP),
        "teams.robotics.vpn_group",
        f"{VISION_GROUP} is also team vision's vpn_group",
        id="vpn-group-is-another-teams",
    ),
    pytest.param(
        _set("teams.robotics.vpn_group", ADMIN_GROUP),
        "teams.robotics.vpn_group",
        f"{ADMIN_GROUP} is environments.prod.client_vpn.saml.admin_group too",
        id="vpn-group-is-the-admin-group",
    ),
    pytest.param(
        _set("teams.admins", {"gpu_quota": 0, "vpn_group": "4a7b3c2d-5555-4e5f-9a8b-team-admins"}),
        "teams.admins",
        "the laptop VPN names its admin_group's rules 'admins'",
        id="team-named-like-the-admin-group-rules",
    ),
    pytest.param(
        _set("teams.robotics.vpn_group", "robotics,vision"),
        "teams.robotics.vpn_group",
        "holds a comma, which an authorization rule's access_group_id may not",
        id="vpn-group-with-a-comma",
    ),
    pytest.param(
        # A job operator's service accounts are trusted to make GPU pods outside the queues: never a team's.
        _set("environments.prod.kubernetes.job_operators", {"kuberay": "team-vision"}),
        "environments.prod.kubernetes.job_operators.kuberay",
        "namespace 'team-vision' is team 'vision''s: its members could then make GPU pods and jobs that bypass Kueue",
        id="job-operator-in-a-team-namespace",
    ),
    pytest.param(
        _set("environments.prod.client_vpn.saml.admin_group", "infra,admins"),
        "environments.prod.client_vpn.saml.admin_group",
        "holds a comma",
        id="admin-group-with-a-comma",
    ),
]


@pytest.mark.parametrize(("change", "key", "message"), CROSS_REFERENCES)
def test_validate_and_cidr_update_refuse_a_broken_reference(
    write_fleet: Callable[..., Path], capsys: pytest.CaptureFixture[str], change: Change, key: str, message: str
) -> None:
    from dlinfra.cli import main as cli

    path = write_fleet(change, lock=False)
    before = sorted(p.name for p in path.parent.iterdir())
    for argv in (["validate"], ["cidr", "--update"]):
        code = cli.main([*argv, "--fleet", str(path)])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_INPUT, argv
        assert err.count("error:") == 1 and f"{path}:" in err and key in err and message in err, err
        line = err.split(f"{path}:", 1)[1].split(":", 1)[0]
        assert line.isdigit(), f"no line number: {err}"
        assert "Traceback" not in err
    assert sorted(p.name for p in path.parent.iterdir()) == before


# --- A fleet validate accepts is one the stacks can look everything up in ------------------------------------
REGIONS = ("us-west-2", "us-east-1", "eu-west-1", "ap-south-1")
ZONES = tuple(zone for region in REGIONS for zone in known_regions()[region].azs)
ROLES = (ADMIN_ROLE, PREVIEW_ROLE, "arn:aws:iam::111122223333:role/team-vision", "arn:aws:iam::111122223333:role/new")
GROUPS = (ADMIN_GROUP, VISION_GROUP, "4a7b3c2d-6666-4e5f-9a8b-team-new")
PROD_POOL_NAMES = ("train-h100", "train-a100", "interactive", "cpu")
TEAMS = ("vision", "language", "robotics")


def _regions_subset() -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(REGIONS), unique=True, max_size=3).map(sorted)


def _at(path: str, value: Any) -> tuple[str, Change]:
    return f"{path} = {value!r}", _set(path, value)


def _reservation(pool: str, region: str, az: str, drop_zones: bool) -> tuple[str, Change]:
    def change(data: dict[str, Any]) -> None:
        spec = data["environments"]["prod"]["node_pools"][pool]
        # Reservations name their zone by id; an AZ label no region has stays as given, for validate to refuse.
        zone_id = next((r.zone_ids[az] for r in known_regions().values() if az in r.zone_ids), az)
        spec.setdefault("capacity_reservations", {})[region] = {"id": "cr-0a1b2c3d4e5f60719", "zone_id": zone_id}
        if drop_zones:
            spec.pop("zones", None)

    return f"{pool} reserves in {region}/{az}{' (zones dropped)' if drop_zones else ''}", change


def _environment_regions(env: str, regions: list[str]) -> tuple[str, Change]:
    def change(data: dict[str, Any]) -> None:
        spec = data["environments"][env]
        spec["regions"] = {r: spec["regions"].get(r, {"transit_asn": 64530 + i}) for i, r in enumerate(regions)}

    return f"environments.{env}.regions = {regions}", change


MUTATIONS = st.one_of(
    st.builds(_reservation, st.sampled_from(PROD_POOL_NAMES), st.sampled_from(REGIONS), st.sampled_from(ZONES),
              st.booleans()),
    st.builds(lambda p, r, z: _at(f"{PROD_POOLS}.{p}.zones", {r: z}), st.sampled_from(PROD_POOL_NAMES),
              st.sampled_from(REGIONS), st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True)),
    st.builds(lambda p, rs: _at(f"{PROD_POOLS}.{p}.regions", rs), st.sampled_from(PROD_POOL_NAMES),
              _regions_subset()),
    st.builds(lambda s, r: _at(f"sites.{s}.region", r), st.sampled_from(("sjc1", "ams1")), st.sampled_from(REGIONS)),
    st.builds(lambda s, e: _at(f"sites.{s}.environment", e), st.sampled_from(("sjc1", "ams1")),
              st.sampled_from(("prod", "staging", "dev"))),
    st.builds(lambda t, rs: _at(f"teams.{t}.overflow", rs), st.sampled_from(TEAMS), _regions_subset()),
    st.builds(lambda t, a: _at(f"teams.{t}.role_arn", a), st.sampled_from(TEAMS), st.sampled_from(ROLES)),
    st.builds(lambda t, g: _at(f"teams.{t}.vpn_group", g), st.sampled_from(TEAMS), st.sampled_from(GROUPS)),
    st.builds(lambda r, n: _at(f"regions.{r}.azs", n), st.sampled_from(REGIONS[:3]), st.integers(2, 4)),
    st.builds(_environment_regions, st.sampled_from(("prod", "staging")),
              st.lists(st.sampled_from(REGIONS), unique=True, min_size=1, max_size=3).map(sorted)),
)  # fmt: skip


def mutated(changes: list[tuple[str, Change]], reference: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(reference)
    for _, change in changes:
        change(data)
    return data


def assert_lookups_hold(fleet: Fleet) -> None:
    """What the stacks look up by a name the fleet gives (stacks/compute.py, regional.py, in_cluster.py) is there."""
    known = known_regions()
    for env_name, region in fleet.regional_stacks():
        assert region in fleet.regions and region in known
        azs = fleet.azs(region)
        for pool_name in fleet.pools_in(env_name, region):
            zones = fleet.pool_zones(env_name, region, pool_name)
            assert zones and set(zones) <= set(azs), (env_name, region, pool_name, zones)  # one private subnet each
            instances.lookup(fleet.pool_types(env_name, region, pool_name)[0])
        for site in fleet.sites_of(env_name, region).values():
            assert site.region in fleet.environments[env_name].regions
    for env_name, env in fleet.environments.items():
        assert fleet.multikueue_manager(env_name) in env.regions
        for team in fleet.teams:
            assert set(fleet.overflow_regions(env_name, team)) <= set(env.regions)
    for site in fleet.sites.values():
        assert site.region in fleet.environments[site.environment].regions


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_every_fleet_validate_accepts_has_what_the_stacks_look_up(
    reference_data: dict[str, Any], changes: list[tuple[str, Change]]
) -> None:
    try:
        fleet = validate_data(mutated(changes, reference_data), Path("fleet.yaml"))
    except FleetError as exc:
        assert exc.key and "Traceback" not in str(exc)  # refused, naming the key
        return
    assert_lookups_hold(fleet)


@pytest.mark.slow
# Each accepted example previews every stack (a few seconds): a few fixed examples, no shrinking.
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(changes=st.lists(MUTATIONS, min_size=1, max_size=2))
def test_preview_never_stops_on_a_fleet_validate_accepts(
    reference_data: dict[str, Any], changes: list[tuple[str, Change]]
) -> None:
    from dlinfra.offline import engine

    with tempfile.TemporaryDirectory() as folder:
        path, lock_path = Path(folder) / "fleet.yaml", Path(folder) / "cidr-lock.yaml"
        path.write_text(yaml.safe_dump(mutated(changes, reference_data), sort_keys=False))
        try:
            loaded = load_fleet(path)
        except FleetError as exc:
            assert exc.key and str(path) in str(exc)
            return
        # What `cidr --update` writes, then what `preview --all` runs; any failure there is the bug.
        plan = planner.plan(loaded, planner.load_lock(REFERENCE_LOCK), update=True)
        planner.save_lock(plan.to_lock(lock_path), lock_path)
        config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(lock_path)}
        engine.run_all(ROOT, stackroles.roles(loaded.fleet), project=loaded.fleet.project, config=config)
