"""The address plan: parametrized cases, bad inputs, and properties that hold for any fleet."""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlinfra.errors import DlinfraError, LockError
from dlinfra.model import planner
from dlinfra.model.fleet.load import LoadedFleet, load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK

Net = ipaddress.IPv4Network


def _plan(path: Path, *, update: bool = False) -> planner.Plan:
    return planner.plan(
        load_fleet(path), planner.load_lock(path.parent / "cidr-lock.yaml", missing_ok=update), update=update
    )


def test_reference_lock_is_complete_and_current() -> None:
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    assert not plan.orphans
    assert planner.render_lock(plan.to_lock()) == REFERENCE_LOCK.read_text()


@pytest.mark.parametrize(
    ("vpc_prefix", "azs", "expected"),
    [
        (16, 3, {"private": 18, "public": 24, "transit": 28}),
        (16, 2, {"private": 18, "public": 24, "transit": 28}),
        (16, 4, {"private": 19, "public": 24, "transit": 28}),
        (16, 1, {"private": 17, "public": 24, "transit": 28}),
        (18, 3, {"private": 20, "public": 26, "transit": 28}),
        (24, 3, {"private": 26, "public": 28, "transit": 28}),
    ],
)
def test_subnet_sizes(vpc_prefix: int, azs: int, expected: dict[str, int]) -> None:
    assert planner.subnet_prefixes(vpc_prefix, azs) == expected


def test_reference_plan_shape() -> None:
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    kinds = {
        k: len(plan.of_kind(k)) for k in ("vpc", "subnet", "client_vpn", "service", "site_lan", "hybrid_pods", "tunnel")
    }
    assert kinds == {
        "vpc": 4,
        "subnet": 36,
        "client_vpn": 4,
        "service": 4,
        "site_lan": 2,
        "hybrid_pods": 2,
        "tunnel": 4,
    }
    assert plan.vpc("staging", "us-west-2").prefixlen == 18
    assert plan.cidr("site-lan/sjc1") == Net("10.200.0.0/20")  # explicit in the fleet
    for alloc in plan.of_kind("tunnel"):
        assert alloc.cidr.prefixlen == 30 and alloc.cidr.subnet_of(planner.LINK_LOCAL)
        assert not any(alloc.cidr.overlaps(r) for r in planner.AWS_RESERVED_TUNNEL_BLOCKS)
    for alloc in plan.of_kind("client_vpn"):
        assert alloc.cidr.prefixlen <= 22
    private = plan.subnets("prod", "us-west-2", "private")
    assert sorted(private) == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert all(n.prefixlen == 18 for n in private.values())


def test_missing_lock_entries_ask_for_update(write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(
        lambda d: d["sites"].__setitem__("lax1", {"region": "us-west-2", "public_ip": "64.62.140.99", "asn": 65110})
    )
    with pytest.raises(LockError, match=r"not in the lock .*site-lan/lax1.*run `dlinfra cidr --update`"):
        _plan(path)


def test_update_allocates_only_new_keys(write_fleet: Callable[..., Path]) -> None:
    before = planner.load_lock(REFERENCE_LOCK).allocations
    path = write_fleet(
        lambda d: d["sites"].__setitem__("lax1", {"region": "us-west-2", "public_ip": "64.62.140.99", "asn": 65110})
    )
    plan = _plan(path, update=True)
    for key, net in before.items():
        assert plan.cidr(key) == net
    assert {k for k in plan.allocations if k not in before} == {
        "site-lan/lax1",
        "hybrid-pods/lax1",
        "tunnel/lax1/1",
        "tunnel/lax1/2",
    }


def test_removed_entries_stay_reserved_until_released(write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(lambda d: d["sites"].pop("ams1"))
    plan = _plan(path)
    assert set(plan.orphans) == {"site-lan/ams1", "hybrid-pods/ams1", "tunnel/ams1/1", "tunnel/ams1/2"}
    freed = planner.release(planner.load_lock(path.parent / "cidr-lock.yaml"), ["site-lan/ams1"])
    assert "site-lan/ams1" not in freed.allocations and "hybrid-pods/ams1" in freed.allocations


def test_releasing_a_vpc_releases_its_subnets() -> None:
    lock = planner.release(planner.load_lock(REFERENCE_LOCK), ["vpc/staging/us-west-2"])
    assert not [k for k in lock.allocations if "/staging/us-west-2" in k and k.startswith(("vpc/", "subnet/"))]


def test_release_unknown_key() -> None:
    with pytest.raises(LockError, match="vpc/nope/x: no such allocation"):
        planner.release(planner.load_lock(REFERENCE_LOCK), ["vpc/nope/x"])


def test_explicit_change_against_lock_is_refused(write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(lambda d: d["sites"]["sjc1"].__setitem__("lan", "10.201.0.0/20"))
    with pytest.raises(DlinfraError, match=r"sites.sjc1.lan: the fleet says 10.201.0.0/20 but .* has 10.200.0.0/20"):
        _plan(path, update=True)


# Bad inputs: overlaps, exhaustion, hand edits -------------------------------------------------------------


def _site(name: str, lan: str | None = None, region: str = "us-west-2") -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d["sites"][name] = {"region": region, "public_ip": "64.62.140.99", "asn": 65120}
        if lan:
            d["sites"][name]["lan"] = lan

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda d: d["environments"]["prod"]["regions"]["us-east-1"].__setitem__("vpc_cidr", "10.200.0.0/16"),
            r"environments.prod.regions.us-east-1.vpc_cidr: the fleet says 10.200.0.0/16",
            id="vpc-vs-site-against-lock",
        ),
        pytest.param(
            _site("lax1", "10.200.8.0/21"),
            r"sites.lax1.lan: 10.200.8.0/21 overlaps sites.sjc1.lan",
            id="site-vs-site",
        ),
        pytest.param(
            _site("lax1", "10.2.4.0/22"),
            r"sites.lax1.lan: 10.2.4.0/22 overlaps 10.2.0.0/16, allocated to vpc/prod/us-west-2",
            id="site-vs-vpc",
        ),
        pytest.param(
            _site("lax1", "10.4.24.0/23"),
            r"sites.lax1.lan: 10.4.24.0/23 overlaps 10.4.24.0/22, allocated to client-vpn/prod/us-west-2",
            id="site-vs-vpn-pool",
        ),
    ],
)
def test_overlaps_name_the_fleet_key(write_fleet: Callable[..., Path], change: Any, message: str) -> None:
    path = write_fleet(change)
    lock_text = (path.parent / "cidr-lock.yaml").read_text()
    with pytest.raises(DlinfraError, match=message):
        _plan(path, update=True)
    assert (path.parent / "cidr-lock.yaml").read_text() == lock_text


@pytest.mark.parametrize(
    ("pod_cidr", "message"),
    [
        ("10.200.0.0/18", r"sites.ams1.pod_cidr: 10.200.0.0/18 overlaps sites.sjc1.lan"),
        ("10.2.128.0/18", r"sites.ams1.pod_cidr: 10.2.128.0/18 overlaps 10.2.0.0/16, allocated to vpc/prod/us-west-2"),
        ("10.3.224.0/20", r"sites.ams1.pod_cidr: 10.3.224.0/20 overlaps .*service/prod/us-west-2"),
    ],
)
def test_site_pod_cidr_overlaps(write_fleet: Callable[..., Path], pod_cidr: str, message: str) -> None:
    path = write_fleet(lambda d: d["sites"]["ams1"].__setitem__("pod_cidr", pod_cidr))
    lock = path.parent / "cidr-lock.yaml"  # as after `cidr --release hybrid-pods/ams1`
    lock.write_text("".join(line for line in lock.read_text().splitlines(True) if "hybrid-pods/ams1" not in line))
    with pytest.raises(DlinfraError, match=message):
        _plan(path, update=True)


def test_explicit_vpc_overlapping_explicit_site(write_fleet: Callable[..., Path]) -> None:
    def change(d: dict[str, Any]) -> None:
        d["environments"]["staging"]["regions"]["us-west-2"]["vpc_cidr"] = "10.200.0.0/18"

    path = write_fleet(change, lock=False)
    with pytest.raises(DlinfraError, match=r"overlaps .*10.200.0.0/(18|20)"):
        _plan(path, update=True)


def test_exhausted_supernet(write_fleet: Callable[..., Path]) -> None:
    def change(d: dict[str, Any]) -> None:
        d["address_space"]["supernet"] = "172.16.0.0/15"  # two /16s for four VPCs and everything else
        d["sites"]["sjc1"]["lan"] = "192.168.0.0/20"

    path = write_fleet(change, lock=False)
    with pytest.raises(DlinfraError, match=r"fleet.yaml: .*no free /\d+ left in supernet 172.16.0.0/15"):
        _plan(path, update=True)
    assert not (path.parent / "cidr-lock.yaml").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(("site-lan/ams1", "10.2.0.0/20"), r"overlaps .*was the lock edited by hand", id="overlap"),
        pytest.param(
            ("subnet/prod/us-west-2/public/us-west-2a", "10.1.0.0/24"),
            r"outside its VPC",
            id="subnet-outside",
        ),
        pytest.param(("tunnel/sjc1/1", "169.254.169.252/30"), r"AWS reserves", id="tunnel-reserved"),
        pytest.param(("tunnel/sjc1/1", "169.254.7.0/29"), r"not a /30", id="tunnel-size"),
        pytest.param(("vpc/prod/us-west-2", "11.0.0.0/16"), r"not inside an RFC 1918", id="public-vpc"),
        pytest.param(("vpc/prod/us-west-2", "10.2.0.0/33"), r"not a CIDR", id="malformed"),
        pytest.param(("bogus/thing", "10.9.0.0/16"), r"unknown allocation key", id="unknown-key"),
    ],
)
def test_hand_edited_lock(write_fleet: Callable[..., Path], edit: tuple[str, str], message: str) -> None:
    path = write_fleet()
    lock_path = path.parent / "cidr-lock.yaml"
    text = lock_path.read_text()
    key, value = edit
    if f"  {key}:" in text:
        text = (
            "\n".join(f"  {key}: {value}" if line.startswith(f"  {key}:") else line for line in text.splitlines())
            + "\n"
        )
    else:
        text += f"  {key}: {value}\n"
    lock_path.write_text(text)
    with pytest.raises(LockError, match=message) as info:
        _plan(path)
    assert "cidr-lock.yaml" in str(info.value)


# Properties over generated fleets --------------------------------------------------------------------

REGIONS = ["us-west-2", "us-east-1", "eu-west-1", "eu-central-1", "ap-northeast-1"]


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, Any]:
    """A random but valid fleet: some regions, one or two environments, some sites."""
    regions = draw(st.lists(st.sampled_from(REGIONS), min_size=1, max_size=4, unique=True))
    envs: dict[str, Any] = {}
    for i, env in enumerate(
        draw(st.lists(st.sampled_from(["prod", "staging", "dev"]), min_size=1, max_size=2, unique=True))
    ):
        env_regions = draw(st.lists(st.sampled_from(regions), min_size=1, max_size=len(regions), unique=True))
        envs[env] = {
            "regions": {r: {"transit_asn": 64512 + i} for r in env_regions},
            "vpc_prefix": draw(st.sampled_from([16, 18, 20])),
            "client_vpn": {"users": ["alice"]} if draw(st.booleans()) else False,
            "kubernetes": {"version": "1.33", "upgrade_policy": "extended"},
        }
    sites = {}
    for n in range(draw(st.integers(0, 4))):
        env = draw(st.sampled_from(sorted(envs)))
        sites[f"site{n}"] = {
            "region": draw(st.sampled_from(sorted(envs[env]["regions"]))),
            "environment": env,
            "public_ip": f"64.62.140.{n + 10}",
            "asn": 65200 + n,
        }
    return {
        "regions": {r: {"primary": r == regions[0], "azs": draw(st.integers(2, 3))} for r in regions},  # EKS needs two
        "environments": envs,
        "sites": sites,
    }


def _loaded(data: dict[str, Any]) -> LoadedFleet:
    return LoadedFleet(fleet=Fleet.model_validate(data), path=Path("generated.yaml"))


def _check_invariants(plan: planner.Plan) -> None:
    allocs = list(plan.allocations.values())
    for a, b in itertools.combinations(allocs, 2):
        if a.kind == "subnet" and b.kind == "vpc" and a.key.split("/")[1:3] == b.key.split("/")[1:3]:
            assert a.cidr.subnet_of(b.cidr)
        elif b.kind == "subnet" and a.kind == "vpc" and a.key.split("/")[1:3] == b.key.split("/")[1:3]:
            assert b.cidr.subnet_of(a.cidr)
        else:
            assert not a.cidr.overlaps(b.cidr), (a, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_allocations_disjoint_and_nested(data: dict[str, Any]) -> None:
    plan = planner.plan(_loaded(data), planner.Lock(), update=True)
    _check_invariants(plan)
    supernet = Net("10.0.0.0/8")
    for alloc in plan.allocations.values():
        assert alloc.cidr.subnet_of(planner.LINK_LOCAL if alloc.kind == "tunnel" else supernet)


@settings(max_examples=40, deadline=None)
@given(fleets())
def test_same_fleet_same_plan(data: dict[str, Any]) -> None:
    assert planner.plan(_loaded(data), planner.Lock(), update=True) == planner.plan(
        _loaded(data), planner.Lock(), update=True
    )


def _reordered(data: dict[str, Any]) -> dict[str, Any]:
    def rev(m: dict[str, Any]) -> dict[str, Any]:
        return dict(reversed(list(m.items())))

    envs = {k: {**v, "regions": rev(v["regions"])} for k, v in rev(data["environments"]).items()}
    return {"regions": rev(data["regions"]), "environments": envs, "sites": rev(data["sites"])}


@settings(max_examples=40, deadline=None)
@given(fleets())
def test_reordering_changes_nothing(data: dict[str, Any]) -> None:
    a = planner.plan(_loaded(data), planner.Lock(), update=True)
    b = planner.plan(_loaded(_reordered(data)), planner.Lock(), update=True)
    assert {k: v.cidr for k, v in a.allocations.items()} == {k: v.cidr for k, v in b.allocations.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), fleets())
def test_adding_and_removing_never_renumbers(first: dict[str, Any], second: dict[str, Any]) -> None:
    """Plan one fleet, lock it, then plan another (entries added and removed): shared keys keep their CIDRs."""
    plan1 = planner.plan(_loaded(first), planner.Lock(), update=True)
    lock = plan1.to_lock()
    merged_regions = {
        **second["regions"],
        **{r: {**s, "primary": False} for r, s in first["regions"].items() if r not in second["regions"]},
    }
    # Regions of `first` survive in `second` only where `second` also uses them; the rest are removals.
    second = {**second, "regions": {r: s for r, s in merged_regions.items() if r in second["regions"]}}
    try:
        plan2 = planner.plan(_loaded(second), lock, update=True)
    except DlinfraError as exc:
        assert "no free" in str(exc)  # a generated fleet may not fit beside the old one's reservations
        return
    for key, net in lock.allocations.items():
        if key in plan2.allocations:
            assert plan2.cidr(key) == net
        else:
            assert plan2.orphans[key] == net  # removed entries stay reserved
    reserved = planner.Plan(
        allocations={
            **plan2.allocations,
            **{k: planner.Allocation(k, planner.kind_of(k), n, "lock") for k, n in plan2.orphans.items()},
        },
        orphans={},
    )
    _check_invariants(reserved)  # orphans stay reserved: nothing new overlaps them
