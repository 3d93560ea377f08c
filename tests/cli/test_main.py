"""The CLI end to end, in-process: exit codes, messages, what it writes and what it never touches."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.cli import main as cli
from dlinfra.model import planner
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_validate_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", "--fleet", str(REFERENCE_FLEET))
    assert code == 0
    assert "9 stacks, 2 sites" in out and "56 allocations, 0 orphaned" in out


def test_cidr_json_lists_every_allocation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cidr", "--json", "--fleet", str(REFERENCE_FLEET))
    assert code == 0
    rows = json.loads(out)["allocations"]
    lock = planner.load_lock(REFERENCE_LOCK).allocations
    assert {r["name"]: r["cidr"] for r in rows} == {k: str(v) for k, v in lock.items()}
    assert all({"name", "kind", "cidr"} <= set(r) for r in rows)


def test_cidr_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cidr", "--fleet", str(REFERENCE_FLEET))
    assert code == 0 and "vpc/prod/us-west-2" in out and "10.2.0.0/16" in out


def _add_site(d: dict[str, Any]) -> None:
    d["sites"]["lax1"] = {"region": "us-west-2", "public_ip": "64.62.140.99", "asn": 65110}


def test_cidr_without_update_refuses_then_update_writes(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    path = write_fleet(_add_site)
    lock = path.parent / "cidr-lock.yaml"
    before = lock.read_text()
    code, _, err = run(capsys, "cidr", "--fleet", str(path))
    assert code == 2 and "run `dlinfra cidr --update`" in err and "Traceback" not in err
    assert lock.read_text() == before
    code, _, err = run(capsys, "cidr", "--update", "--fleet", str(path))
    assert code == 0 and "wrote" in err
    after = planner.load_lock(lock).allocations
    assert "site-lan/lax1" in after
    for key, net in planner.load_lock(REFERENCE_LOCK).allocations.items():
        assert after[key] == net


def test_release_is_explicit(capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(lambda d: d["sites"].pop("ams1"))
    code, _, err = run(capsys, "validate", "--fleet", str(path))
    assert code == 0 and "site-lan/ams1" in err and "stays reserved" in err
    code, _, err = run(capsys, "cidr", "--release", "vpc/prod/us-west-2", "--fleet", str(path))
    assert code == 2 and "still used by environments.prod.regions.us-west-2" in err
    code, _, _ = run(capsys, "cidr", "--release", "site-lan/ams1", "--fleet", str(path))
    assert code == 0
    assert "site-lan/ams1" not in planner.load_lock(path.parent / "cidr-lock.yaml").allocations


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["regions"].__setitem__("us-west-9", {}), "unknown region"),
        (lambda d: d["sites"]["ams1"].__setitem__("lan", "10.200.4.0/22"), "sites.ams1.lan"),
        (lambda d: d.__setitem__("colour", "blue"), "colour: unknown key"),
    ],
)
def test_bad_input_exits_2_and_leaves_the_lock(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path], change: Any, message: str
) -> None:
    path = write_fleet(change)
    lock = path.parent / "cidr-lock.yaml"
    before = lock.read_bytes()
    for command in (["validate"], ["cidr", "--update"], ["preview", "--all"]):
        code, out, err = run(capsys, *command, "--fleet", str(path))
        assert code == 2, command
        assert message in err and str(path) in err and "Traceback" not in err + out
        assert lock.read_bytes() == before


def test_preview_unknown_stack(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "preview", "--stack", "prod-mars-1", "--fleet", str(REFERENCE_FLEET))
    assert code == 2 and "stack 'prod-mars-1'" in err and "stacks of this fleet: prod-us-west-2" in err


def test_preview_global_runs_its_dependencies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(
        capsys, "preview", "--stack", "prod-global", "--empty", "--out", str(tmp_path), "--fleet", str(REFERENCE_FLEET)
    )
    assert code == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "prod-eu-west-1.json",
        "prod-global.json",
        "prod-us-east-1.json",
        "prod-us-west-2.json",
    ]
    assert "Previewing prod-global" in out and "pulumi:pulumi:StackReference" in out
    plan = json.loads((tmp_path / "prod-global.json").read_text())
    assert plan["outputs"]["vpc_cidrs"]["us-west-2"] == "10.2.0.0/16"


def test_preview_of_an_in_cluster_stack_runs_every_stack_it_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # prod-us-west-2-k8s manages MultiKueue: it reads the workers' in-cluster stacks, which read their regions'.
    code, _out, err = run(
        capsys,
        "preview",
        "--stack",
        "prod-us-west-2-k8s",
        "--summary",
        "--empty",
        "--out",
        str(tmp_path),
        "--fleet",
        str(REFERENCE_FLEET),
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "prod-eu-west-1-k8s.json",
        "prod-eu-west-1.json",
        "prod-us-east-1-k8s.json",
        "prod-us-east-1.json",
        "prod-us-west-2-k8s.json",
        "prod-us-west-2.json",
    ]


def test_preview_takes_an_images_manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    text = (ROOT / "images" / "manifest.example.json").read_text()
    manifest.write_text(text.replace("us-east-1:ami-", "ap-south-1:ami-"))
    argv = ["preview", "--stack", "prod-us-east-1", "--summary", "--out", str(tmp_path / "plans")]
    code, _, err = run(capsys, *argv, "--images-manifest", str(manifest), "--fleet", str(REFERENCE_FLEET))
    assert code == 2
    assert "environments.prod.node_pools." in err and "no AMI for variant" in err and "us-east-1" in err
    assert str(manifest) in err


def test_team_quotas_over_capacity_fail_before_any_stack(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    path = write_fleet(lambda d: d["teams"]["vision"].__setitem__("gpu_quota", 100000))
    for command in (["validate"], ["preview", "--all", "--out", str(tmp_path / "plans")]):
        code, out, err = run(capsys, *command, "--fleet", str(path))
        assert code == 2, command
        assert str(path) in err and ": teams: team GPU quotas add up to" in err and "environment 'prod'" in err
        assert "Previewing" not in out
    assert not (tmp_path / "plans").exists()


def test_preview_json_is_one_document_with_masked_outputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["preview", "--stack", "staging-us-west-2", "--json", "--empty", "--out", str(tmp_path / "plans")]
    code, out, _ = run(capsys, *argv, "--fleet", str(REFERENCE_FLEET))
    assert code == 0
    document = json.loads(out)  # nothing else on stdout
    assert document["schema"] == "dlinfra.preview/v1"
    (stack,) = document["stacks"]
    assert stack["stack"] == "staging-us-west-2" and stack["role"]["kind"] == "regional"
    assert stack["resources"]["resources"] > 100 and stack["plan"].endswith("staging-us-west-2.json")
    assert stack["outputs"]["client_vpn_users"] == "[secret]" and stack["outputs"]["vpc_cidr"].startswith("10.")
    saved = json.loads((tmp_path / "plans" / "staging-us-west-2.json").read_text())
    assert document["provenance"] == saved["provenance"] and len(document["provenance"]["code"]) == 64


def test_stacks_refuses_an_account_the_in_vpc_runners_would_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    # apply.yml's plan job runs this with github.actor_id, so a push by an unlisted account fails in seconds instead of
    # leaving the k8s job queued for a runner that never comes.
    code, out, err = run(capsys, "stacks", "--fleet", str(REFERENCE_FLEET), "--only", "prod-eu-west-1-k8s",
                         "--actor-id", "4242")  # fmt: skip
    assert code == 2 and out == ""
    lines = REFERENCE_FLEET.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, start=1) if "runner_actor_ids:" in text)  # prod's comes first
    assert f"{REFERENCE_FLEET}:{line}: environments.prod.ci.runner_actor_ids: GitHub account 4242" in " ".join(
        err.split()
    )
    code, out, _ = run(capsys, "stacks", "--fleet", str(REFERENCE_FLEET), "--only", "prod-eu-west-1-k8s", "--json",
                       "--actor-id", "9919")  # fmt: skip
    assert code == 0 and [r["stack"] for r in json.loads(out)["k8s"]] == ["prod-eu-west-1-k8s"]


def test_validate_warns_of_an_activation_expiry_aws_would_refuse(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    """Judged by the (pinned) clock, as CreateActivation judges it when the activation is created or replaced."""
    for expiry, problem in (("2026-11-01T00:00:00Z", "has passed"), ("2027-01-30T00:00:00Z", "more than 30 days")):
        path = write_fleet(lambda d, e=expiry: d["sites"]["sjc1"].__setitem__("activation_expiry", e))
        code, _, err = run(capsys, "validate", "--fleet", str(path))
        assert code == 0
        assert "sites.sjc1.activation_expiry" in err and problem in err, err
    path = write_fleet(lambda d: d["sites"]["sjc1"].__setitem__("activation_expiry", "2026-12-01T00:00:00Z"))
    assert "activation_expiry" not in run(capsys, "validate", "--fleet", str(path))[2]
