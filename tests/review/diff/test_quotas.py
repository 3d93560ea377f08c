"""The diff's "Team GPU quotas": each team's guaranteed and borrowable GPUs before and after, from each revision's
Kueue objects, every changed flavor listed whole, and the head's teams without a guarantee."""

from __future__ import annotations

import json
from typing import Any

from dlinfra.review.diff import render
from dlinfra.review.diff.compare import compare, quota_changes
from dlinfra.review.diff.plans import PlanSet, topology

K8S = "prod-us-west-2-k8s"
CQ = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
COHORT = "kubernetes:kueue.x-k8s.io/v1beta2:Cohort"


def _kueue(type_: str, name: str, flavors: dict[str, tuple[int, int | None]], cohort: bool = True) -> dict[str, Any]:
    resources = []
    for flavor, (nominal, borrowing) in flavors.items():
        gpu: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(nominal)}
        if borrowing is not None:
            gpu["borrowingLimit"] = str(borrowing)
        resources.append({"name": flavor, "resources": [gpu]})
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": resources}]}
    if cohort and type_ == CQ:
        spec["cohortName"] = "research"
    kind = type_.rsplit(":", 1)[-1]
    return {
        "urn": f"urn:pulumi:{K8S}::dlinfra::dlinfra:k8s:Platform${type_}::platform-{kind}-{name}",
        "type": type_,
        "name": f"platform-{kind}-{name}",
        "custom": True,
        "inputs": {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name}, "spec": spec},
    }


def _plans(teams: dict[str, dict[str, int]], capacity: dict[str, int]) -> dict[str, Any]:
    """One in-cluster stack: each team's queue with its nominal GPUs and the rest of each flavor to borrow."""
    resources = [_kueue(CQ, t, {f: (n, capacity[f] - n) for f, n in q.items()}) for t, q in teams.items()]
    spare = {f: (c - sum(q.get(f, 0) for q in teams.values()), None) for f, c in capacity.items()}
    resources.append(_kueue(COHORT, "research", spare))
    role = {"kind": "k8s", "environment": "prod", "region": "us-west-2"}
    return {K8S: {"schema": "dlinfra.plan/v1", "stack": K8S, "role": role, "resources": resources}}


BASE = PlanSet(label="main", plans=_plans({"vision": {"pool-a": 6, "pool-b": 2}}, {"pool-a": 8, "pool-b": 4}))
HEAD = PlanSet(
    label="pull request",
    plans=_plans(
        {"vision": {"pool-a": 4, "pool-b": 2, "pool-c": 2}, "audio": {"pool-a": 0, "pool-b": 0, "pool-c": 0}},
        {"pool-a": 8, "pool-b": 4, "pool-c": 8},
    ),
    topology=topology({"environments": {"prod": {"gpu_quotas": "scaled"}}}),
)


def test_each_changed_flavor_before_and_after() -> None:
    diff = compare(BASE, HEAD)
    changes = {(c.team, c.flavor): (c.before, c.after) for c in quota_changes(diff)}
    # vision's pool-b is unchanged (2 guaranteed, 2 to borrow): not listed.
    assert set(changes) == {("audio", "pool-a"), ("audio", "pool-b"), ("audio", "pool-c"), ("vision", "pool-a"),
                            ("vision", "pool-c")}  # fmt: skip
    before, after = changes[("vision", "pool-a")]
    assert before is not None and after is not None
    assert (before.guaranteed, before.borrowable, after.guaranteed, after.borrowable) == (6, 2, 4, 4)
    assert changes[("audio", "pool-c")][0] is None  # a new team: nothing before


def test_markdown_section_lists_every_flavor_and_the_new_warning() -> None:
    markdown = render.render_markdown(compare(BASE, HEAD))
    section = markdown[markdown.index("### Team GPU quotas") :].split("\n### ", 1)[0]
    assert "| `vision` | prod | us-west-2 | `pool-a` | 6 → 4 | 2 → 4 |" in section
    assert "| `vision` | prod | us-west-2 | `pool-c` | – → 2 | – → 6 |" in section
    assert "| `vision` | prod | **all regions** | | **8 → 8** | 4 → 12 |" in section
    assert "| `audio` | prod | **all regions** | | **– → 0** | – → 20 |" in section
    assert "…" not in section and "more |" not in section
    warning = section[section.index("> [!WARNING]") :]
    assert "> - team audio is guaranteed no GPUs in environment prod" in warning
    assert "gpu_quotas: scaled" in warning  # the head's fleet says why
    # The section comes before the per-stack details, where a Kueue object's spec is shown cut short.
    assert markdown.index("### Team GPU quotas") < markdown.index(f"### `{K8S}`")


def test_no_change_says_so_and_a_standing_warning_is_not_news() -> None:
    diff = compare(HEAD, HEAD)
    markdown = render.render_markdown(diff)
    section = markdown[markdown.index("### Team GPU quotas") :].split("\n### ", 1)[0]
    assert "No team's guaranteed or borrowable GPUs change." in section
    assert "> [!WARNING]" not in section
    assert "Already so before this change:\n\n- team audio is guaranteed no GPUs" in section


def test_plans_without_queues_have_no_section() -> None:
    empty = PlanSet(label="x", plans={})
    assert "Team GPU quotas" not in render.render_markdown(compare(empty, empty))


def test_json_has_the_changes_the_warnings_and_both_sides() -> None:
    data = json.loads(json.dumps(render.to_json(compare(BASE, HEAD))))
    quotas = data["quotas"]
    assert {
        "environment": "prod",
        "team": "vision",
        "region": "us-west-2",
        "flavor": "pool-a",
        "before": {"guaranteed": 6, "borrowable": 2},
        "after": {"guaranteed": 4, "borrowable": 4},
    } in quotas["changes"]
    assert any(c["team"] == "audio" and c["before"] is None for c in quotas["changes"])
    assert len(quotas["warnings"]) == 1 and quotas["warnings"][0].startswith("team audio")
    assert len(quotas["base"]) == 2 and len(quotas["head"]) == 6
