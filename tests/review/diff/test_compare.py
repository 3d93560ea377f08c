"""The pure comparison: creates, updates, replacements and deletes per stack, the stacks a real preview covers,
and the fleet entities a change adds or removes."""

from __future__ import annotations

from dlinfra.review.diff import render
from dlinfra.review.diff.changes import Change, Diff
from dlinfra.review.diff.compare import compare, compare_stack, entity_summary, touched
from dlinfra.review.diff.plans import PlanSet, topology
from tests.conftest import REFERENCE_FLEET
from tests.review.diff.conftest import EFS, STACK, plan, resource


def _change(result: Diff, name: str, stack: str = STACK) -> Change:
    (found,) = [c for c in result.changes if c.name == name and c.stack == stack]
    return found


def test_creates_updates_replacements_deletes(result: Diff) -> None:
    assert _change(result, "flow-log").action == "create"
    public = _change(result, "public-a")
    assert public.action == "update" and public.inputs == ("mapPublicIpOnLaunch", "tags.owner")
    vpc = _change(result, "vpc")
    assert vpc.action == "replace" and vpc.inputs == ("cidrBlock",)
    scratch = _change(result, "scratch")
    assert scratch.action == "delete" and scratch.stateful and "protected" in scratch.note


def test_unchanged_resources_do_not_appear(result: Diff) -> None:
    assert not [c for c in result.changes if c.name in ("private-a", "home")]


def test_urn_change_without_alias_is_a_replacement(result: Diff) -> None:
    eip = _change(result, "nat-eip")
    assert eip.action == "replace" and eip.inputs == ("(urn)",) and "add aliases" in eip.note


def test_whole_stacks_added_and_removed(result: Diff) -> None:
    assert result.stacks_added == ("prod-new-1",) and result.stacks_removed == ("prod-old-1",)
    assert _change(result, "vpc", "prod-old-1").action == "delete"
    assert _change(result, "vpc", "prod-new-1").action == "create"


def test_replace_on_changes_option_forces_replacement() -> None:
    before = resource("aws:ec2/launchTemplate:LaunchTemplate", "lt", inputs={"userData": "a"})
    after = {**before, "inputs": {"userData": "b"}, "replace_on_changes": ["userData"]}
    (change,) = compare_stack(STACK, plan(STACK, before), plan(STACK, after))
    assert change.action == "replace" and change.inputs == ("userData",)


def test_dropping_protection_from_stateful_data_is_called_out() -> None:
    before = resource(EFS, "home", "dlinfra:storage:Storage", protect=True, inputs={"encrypted": True})
    after = {**before, "protect": False}
    (change,) = compare_stack(STACK, plan(STACK, before), plan(STACK, after))
    assert change.action == "update" and change.inputs == ("(protect: true → false)",)
    result = compare(
        PlanSet(label="a", plans={STACK: plan(STACK, before)}),
        PlanSet(label="b", plans={STACK: plan(STACK, after)}),
    )
    assert result.unprotected == [change]
    head = render.render_markdown(result).split("| stack |")[0]
    assert "Stateful resources lose their protection" in head and "`home` in `prod-us-west-2`" in head


def test_engine_floats_equal_integers() -> None:
    before = resource("aws:autoscaling/group:Group", "asg", inputs={"maxSize": 4.0})
    after = {**before, "inputs": {"maxSize": 4}}
    assert compare_stack(STACK, plan(STACK, before), plan(STACK, after)) == []


def test_touched_stacks(result: Diff) -> None:
    assert [t["stack"] for t in touched(result)] == ["prod-new-1", STACK]
    config_only = compare(
        PlanSet("a", {STACK: plan(STACK)}, configs={STACK: "config: {}"}),
        PlanSet("b", {STACK: plan(STACK)}, configs={STACK: "config: {aws:region: x}"}),
    )
    assert [t["stack"] for t in touched(config_only)] == [STACK]
    assert "Stack config changed: `prod-us-west-2`" in render.render_markdown(config_only)


def test_creates_and_deletes_are_named_by_pool_team_and_site() -> None:
    import yaml

    from tests import reference
    from tests.review.diff.test_golden import _pool_team_site_run  # one offline run of that fleet, shared

    head, text = _pool_team_site_run()
    base = {name: r.plan("dlinfra") for name, r in reference.runs().items()}
    result = compare(
        PlanSet(label="base", plans=base, topology=topology(yaml.safe_load(REFERENCE_FLEET.read_text()))),
        PlanSet(label="head", plans=head, topology=topology(yaml.safe_load(text))),
    )
    named = entity_summary(result)
    assert named[0] == "- site ams1 (prod, 3 regions)"  # what goes away first
    assert "+ pool infer-l4 (prod, 2 regions)" in named
    assert any(n.startswith("+ team audio (prod") for n in named)
    assert "**What this changes:** `- site ams1 (prod, 3 regions)`" in render.render_markdown(result)
