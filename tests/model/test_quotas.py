"""The quota table: its shape, the figures read from AWS's and Kubernetes' pages, and raised values in the fleet."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml

from dlinfra.errors import FleetError
from dlinfra.model import quotas
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.quotas import QuotaTableError
from tests.conftest import ROOT

# (key, service, code, default, adjustable): as read on the pages named in dlinfra/data/quotas.yaml.
FIGURES = [
    ("vpcs-per-region", "vpc", "L-F678F1CE", 5, True),
    ("elastic-ips-per-region", "ec2", "L-0263D0A3", 5, True),
    ("routes-per-route-table", "vpc", "L-93826ACB", 500, True),
    ("inbound-rules-per-security-group", "vpc", "L-0EA8095F", 60, True),
    ("outbound-rules-per-security-group", "vpc", "L-0EA8095F", 60, True),
    ("security-groups-per-interface", "vpc", "L-2AFB9258", 5, True),
    ("tgw-peering-attachments", "ec2", "L-A1B5A36F", 50, True),
    ("tgw-pending-peering-attachments", "ec2", "L-62499967", 10, True),
    ("transit-gateways-per-region", "ec2", "L-A2478D36", 5, True),
    ("interface-endpoints-per-vpc", "vpc", "L-29B6F2EB", 50, True),
    ("client-vpn-endpoints-per-region", "ec2", "L-8EA77D34", 5, True),
    ("client-vpn-routes-per-association", "ec2", "L-401D78F7", 100, True),
    ("client-vpn-authorization-rules", "ec2", "L-9A1BC94B", 200, True),
    ("eks-control-plane-security-groups", "eks", None, 4, False),
    ("eks-remote-node-networks", "eks", "L-5C12D558", 15, True),
    ("eks-remote-pod-networks", "eks", "L-6AFFD1D8", 15, True),
    ("nodes-per-cluster", "kubernetes", None, 5000, False),
    ("pods-per-cluster", "kubernetes", None, 150000, False),
    ("subnet-addresses", "vpc", None, None, False),
    ("network-interfaces-per-region", "vpc", "L-DF5E4CA3", 5000, True),
    ("lambda-concurrent-executions", "lambda", "L-B99A9384", 1000, True),
    # AWS sets it per account from internal metrics; new accounts report 0 ("Cannot have more than 0 builds in queue").
    ("codebuild-linux-small-builds", "codebuild", "L-9D07B6EF", 0, True),
    ("ec2-on-demand-standard-vcpus", "ec2", "L-1216C47A", 5, True),
    ("ec2-on-demand-g-vt-vcpus", "ec2", "L-DB2E81BA", 0, True),
    ("ec2-on-demand-p-vcpus", "ec2", "L-417A185B", 0, True),
    ("ec2-spot-standard-vcpus", "ec2", "L-34B43A08", 5, True),
    ("ec2-spot-g-vt-vcpus", "ec2", "L-3819A6DF", 0, True),
    ("ec2-spot-p-vcpus", "ec2", "L-7212CCBC", 0, True),
    ("ec2-spot-p5-vcpus", "ec2", "L-C4BD4855", 0, True),
    ("iam-managed-policies-per-role", "iam", "L-0DA4ABF3", 10, True),
]


@pytest.mark.parametrize(("key", "service", "code", "default", "adjustable"), FIGURES)
def test_figures(key: str, service: str, code: str | None, default: int | None, adjustable: bool) -> None:
    q = quotas.table().quotas[key]
    assert (q.service, q.code, q.default, q.adjustable) == (service, code, default, adjustable)


def test_every_quota_is_pinned_by_a_figure_and_cites_its_page() -> None:
    table = quotas.table()
    assert set(table.quotas) == {f[0] for f in FIGURES}
    assert table.read_on == datetime.date(2026, 11, 25)
    for q in table.quotas.values():
        assert q.source.split("https://", 1)[1].startswith(("docs.aws.amazon.com/", "kubernetes.io/docs/")), q.key
        assert q.per in (
            "region",
            "vpc",
            "route-table",
            "security-group",
            "network-interface",
            "transit-gateway",
            "client-vpn-endpoint",
            "client-vpn-association",
            "cluster",
            "subnet",
            "build-project",
            "role",
        )


@pytest.mark.parametrize(
    ("family", "on_demand", "spot"),
    [
        ("g6", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        ("g4ad", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        ("g5g", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        # Gr6 is a G family (NVIDIA L4): a `(g|vt)\d` pattern would count it nowhere, and a pool of it would pass.
        ("gr6", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        ("gr6f", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        ("vt1", "ec2-on-demand-g-vt-vcpus", "ec2-spot-g-vt-vcpus"),
        ("r7i", "ec2-on-demand-standard-vcpus", "ec2-spot-standard-vcpus"),
        ("p4d", "ec2-on-demand-p-vcpus", "ec2-spot-p-vcpus"),
        ("p5", "ec2-on-demand-p-vcpus", "ec2-spot-p5-vcpus"),
    ],
)
def test_each_family_counts_against_one_vcpu_quota_per_market(family: str, on_demand: str, spot: str) -> None:
    counted = {q.market: q.key for q in quotas.table().quotas.values() if q.counts_family(family)}
    assert counted == {"on-demand": on_demand, "spot": spot}


def test_the_raw_table_has_the_documented_fields() -> None:
    raw = yaml.safe_load((ROOT / "dlinfra" / "data" / "quotas.yaml").read_text())
    fields = {"name", "service", "code", "default", "adjustable", "per", "source"}
    for key, entry in raw["quotas"].items():
        assert fields <= set(entry) <= fields | {"note", "families", "market"}, key


def test_request_hint_names_the_code_or_says_why_not() -> None:
    table = quotas.table().quotas
    assert table["vpcs-per-region"].request_hint(7) == (
        "adjustable: request an increase (Service Quotas vpc/L-F678F1CE: aws service-quotas "
        "request-service-quota-increase --service-code vpc --quota-code L-F678F1CE --desired-value 7), then write "
        "the value AWS applied in the fleet (quotas: {L-F678F1CE: 7}, or regions.<region>.quotas)"
    )
    assert table["nodes-per-cluster"].request_hint(6000) == "not adjustable: change the plan"


_GOOD = {
    "name": "Things per Region",
    "service": "vpc",
    "code": "L-00000000",
    "default": 5,
    "adjustable": True,
    "per": "region",
    "source": "A guide, a page: https://docs.aws.amazon.com/x.html",
}


def _table(**changes: object) -> str:
    return yaml.safe_dump({"read_on": datetime.date(2026, 1, 1), "quotas": {"things": {**_GOOD, **changes}}})


def test_good_entry_parses() -> None:
    assert quotas.parse_table(_table(), "q.yaml").quotas["things"].default == 5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_table(code="F678F1CE"), r"code: String should match pattern"),
        (_table(adjustable=False), r"code: only an adjustable quota has a code"),
        (_table(service="kubernetes"), r"code: Kubernetes' limits are not AWS service quotas"),
        (_table(source="somewhere, trust me"), r"source: name the page and its address"),
        (_table(default=-1), r"default: Input should be greater than or equal to 0"),
        (_table(families="p\\d.*"), r"families and market: a vCPU quota gives both"),
        (_table(families="p[", market="spot"), r"families: not a regular expression"),
        (_table(per="galaxy"), r"per: Input should be"),
        (_table(colour="red"), r"colour: Extra inputs are not permitted"),
        ("quotas: {}\n", r"expected `read_on` and a mapping"),
        ("read_on: soon\nquotas: {a: {}}\n", r"read_on: the date"),
        ("a: [\n", r"not valid YAML"),
    ],
)
def test_bad_table_is_rejected_with_file_and_key(text: str, expected: str) -> None:
    with pytest.raises(QuotaTableError, match=expected) as info:
        quotas.parse_table(text, "q.yaml")
    assert str(info.value).startswith("q.yaml")


def test_applied_value_region_over_fleet_over_default() -> None:
    q = quotas.table().quotas["elastic-ips-per-region"]
    assert quotas.applied(q, "us-west-2", {}, {}) == (5, False)
    assert quotas.applied(q, "us-west-2", {"L-0263D0A3": 10}, {}) == (10, True)
    assert quotas.applied(q, "us-west-2", {"L-0263D0A3": 10}, {"us-west-2": {"L-0263D0A3": 20}}) == (20, True)
    assert quotas.applied(q, "eu-west-1", {"L-0263D0A3": 10}, {"us-west-2": {"L-0263D0A3": 20}}) == (10, True)
    nodes = quotas.table().quotas["nodes-per-cluster"]
    assert quotas.applied(nodes, "us-west-2", {"L-0263D0A3": 10}, {}) == (5000, False)


def _fleet_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "tests" / "fixtures" / "fleet.yaml").read_text()
    assert old in text
    path = tmp_path / "fleet.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_fleet_takes_accounts_and_raised_quotas(tmp_path: Path) -> None:
    path = _fleet_with(tmp_path, "quotas:\n", "quotas:\n  L-0263D0A3: 10\n")
    path.write_text(
        path.read_text()
        .replace("    azs: 3\n", "    azs: 3\n    quotas: {L-F678F1CE: 12}\n", 1)
        .replace("  prod:\n", "  prod:\n    account: '111122223333'\n", 1)
    )
    fleet = load_fleet(path).fleet
    reference = load_fleet(ROOT / "tests" / "fixtures" / "fleet.yaml").fleet.quotas
    assert fleet.quotas == {**reference, "L-0263D0A3": 10}
    assert fleet.regions[fleet.primary_region].quotas == {"L-F678F1CE": 12}
    assert fleet.environments["prod"].account == "111122223333" and fleet.environments["staging"].account is None


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("quotas:\n", "quotas:\n  L-12345678: 3\n", r"quotas: L-12345678 is not a quota dlinfra"),
        ("quotas:\n", "quotas:\n  vpcs: 3\n", r"quotas: 'vpcs' is not a Service Quotas code"),
        ("quotas:\n", "quotas:\n  L-0263D0A3: 0\n", r"quotas.L-0263D0A3: Input should be greater"),
        ("  prod:\n", "  prod:\n    account: '1234'\n", r"environments.prod.account: String should match"),
        ("    azs: 3\n", "    azs: 3\n    quotas: {L-00000000: 1}\n", r"quotas: L-00000000 is not a quota"),
    ],
)
def test_fleet_refuses_bad_quota_values_naming_the_key(tmp_path: Path, old: str, new: str, expected: str) -> None:
    with pytest.raises(FleetError, match=expected) as info:
        load_fleet(_fleet_with(tmp_path, old, new))
    assert f"{tmp_path / 'fleet.yaml'}:" in str(info.value)
