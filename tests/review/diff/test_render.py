"""The diff's markdown and JSON: what blocks or hurts first, the tables, the address plan, the diagram, cost."""

from __future__ import annotations

import copy

from dlinfra.review.diff import render
from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet
from tests.review.diff.conftest import BASE, BUCKET, STACK, SUBNET, TAGS, VPC, plan, reference_sets, resource


def test_stateful_loss_and_renumbering_are_at_the_top(markdown: str) -> None:
    head = markdown.split("| stack |")[0]
    assert render.COMMENT_MARKER in head and "> [!CAUTION]" in head
    assert "**DELETE** `aws:s3/bucket:Bucket` `scratch` in `prod-us-west-2`" in head
    assert "S3 bucket: datasets, checkpoints and results" in head
    assert "`vpc/prod/us-west-2`: 10.2.0.0/16 → 10.9.0.0/16" in head


def test_summary_and_per_stack_tables(markdown: str) -> None:
    assert "| `prod-us-west-2` | 1 | 1 | 2 | 1 |" in markdown
    assert "| `prod-new-1` (new stack) | 1 | 0 | 0 | 0 |" in markdown
    assert "| `aws:ec2/vpc:Vpc` | 1 | `cidrBlock` |" in markdown  # replacements by type
    assert (
        "| `aws:ec2/subnet:Subnet` | `public-a` | `mapPublicIpOnLaunch`, `tags.owner`"
        "<br>`mapPublicIpOnLaunch`: false → true<br>`tags`: owner: infra → platform |"
    ) in markdown
    assert "| `aws:ec2/flowLog:FlowLog` | 1 |" in markdown


def test_address_plan_section(markdown: str) -> None:
    assert "| `site-lan/ams1` |  | 10.4.0.0/20 | added |" in markdown
    assert "| `site-lan/sjc1` | 10.200.0.0/20 |  | released |" in markdown
    assert "| `vpc/prod/us-west-2` | 10.2.0.0/16 | 10.9.0.0/16 | **renumbered** |" in markdown


def test_mermaid_diagram_marks_what_changes(markdown: str) -> None:
    block = markdown.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block.startswith("flowchart LR")
    assert 'subgraph r_us_west_2["AWS us-west-2 (primary)"]' in block
    assert 'site_ams1 ==>|"IPsec static (new)"| s_prod_eu_west_1' in block
    assert 'site_sjc1 ---|"IPsec bgp"| s_prod_us_west_2' in block
    assert 's_prod_eu_west_1 ==>|"TGW peering (new)"| s_prod_us_east_1' in block
    assert "  class s_prod_eu_west_1,r_eu_west_1,site_ams1 added\n" in block


def test_no_changes() -> None:
    text = render.render_markdown(compare(BASE, BASE))
    assert "No changes" in text and "[!CAUTION]" not in text and "No allocation added" in text


def test_huge_diffs_are_truncated_for_github() -> None:
    many = [resource(SUBNET, f"s{i:05d}", inputs={"cidrBlock": f"10.{i // 256}.{i % 256}.0/24"}) for i in range(3000)]
    updated = [{**r, "inputs": {**r["inputs"], "tags": {"n": "1"}}} for r in many]
    text = render.render_markdown(
        compare(PlanSet("a", {STACK: plan(STACK, *many)}), PlanSet("b", {STACK: plan(STACK, *updated)}))
    )
    assert len(text) <= render.MAX_MARKDOWN + 200 and "more |" in text


def test_raising_a_pool_max_shows_the_cost_change() -> None:
    from dlinfra.review import cost

    base, _ = reference_sets()
    raised = copy.deepcopy(dict(base.plans))
    (group,) = [r for r in raised[STACK]["resources"] if r["name"] == "pool-interactive-asg"]
    group["inputs"]["maxSize"] = 24.0  # was 12
    before, after = cost.estimate(base.plans.values()).to_json(), cost.estimate(raised.values()).to_json()
    result = compare(
        PlanSet(label="base", plans=base.plans, cost=before), PlanSet(label="head", plans=raised, cost=after)
    )
    text = render.render_markdown(result)
    assert "### Cost (USD per month)" in text
    section = text.split("### Cost (USD per month)", 1)[1]
    (row,) = [line for line in section.splitlines() if line.startswith(f"| `{STACK}` |")]
    # 12 more g6.12xlarge at the table's price, for 730 hours; the minimum is unchanged.
    (interactive,) = [
        i
        for s in after["stacks"]
        if s["stack"] == STACK
        for i in s["items"]
        if i["label"].startswith("pool interactive")
    ]
    delta = 12 * 730 * interactive["usd_each"]
    shown = float(row.rsplit("|", 2)[1].strip().lstrip("+").replace(",", ""))
    assert abs(shown - delta) <= 0.01 and "| 0 |" in row  # totals are sums of cents: one cent of rounding


def test_what_blocks_or_hurts_comes_first_with_old_and_new_values() -> None:
    group = "aws:autoscaling/group:Group"
    rule = "aws:ec2clientvpn/authorizationRule:AuthorizationRule"
    base_resources = [
        resource(BUCKET, "datasets", "dlinfra:storage:Storage", protect=True, inputs={"bucket": "dlinfra-datasets"}),
        resource(group, "pool-cpu-asg", "dlinfra:compute:NodePool", inputs={"minSize": 2.0, "maxSize": 40.0}),
        resource(SUBNET, "private-a", inputs={"cidrBlock": "10.2.0.0/18", "tags": TAGS}),
        resource(rule, "sg", inputs={"securityGroupIds": ["sg-a", "sg-b"], "description": "x"}),
    ]
    head_resources = [
        resource(group, "pool-cpu-asg", "dlinfra:compute:NodePool", inputs={"minSize": 2.0, "maxSize": 8.0}),
        resource(SUBNET, "private-a", inputs={"cidrBlock": "10.2.0.0/18", "tags": {**TAGS, "owner": "ml"}}),
        resource(rule, "sg", inputs={"securityGroupIds": ["sg-b", "sg-c"], "description": "x"}),
    ]
    result = compare(
        PlanSet(label="main", plans={STACK: plan(STACK, *base_resources)}),
        PlanSet(label="pr", plans={STACK: plan(STACK, *head_resources)}),
    )
    assert [c.name for c in result.blocking] == ["datasets"]
    assert [c.name for c in result.capacity_reductions] == ["pool-cpu-asg"]
    text = render.render_markdown(result)
    blocking, reduction, summary = (
        text.index("This apply stops here"),
        text.index("Node capacity goes down"),
        text.index("| stack | create |"),
    )
    assert blocking < reduction < summary  # before everything else, never inside a collapsed section
    assert "> - **DELETE** `aws:s3/bucket:Bucket` `datasets` in `prod-us-west-2`" in text
    assert "> - `pool-cpu-asg` in `prod-us-west-2`: maxSize 40 → 8" in text
    assert "<br>`maxSize`: 40 → 8" in text
    assert "<br>`tags`: owner: infra → ml" in text
    assert "<br>`securityGroupIds`: +sg-c, -sg-a" in text


def test_changed_stacks_are_listed_in_apply_order() -> None:
    regional, k8s, world = "prod-us-west-2", "prod-us-west-2-k8s", "prod-global"
    roles = {regional: "regional", k8s: "k8s", world: "global"}
    base, head = {}, {}
    for stack, kind in roles.items():
        base[stack] = {**plan(stack, resource(VPC, "vpc", inputs={"cidrBlock": "10.2.0.0/16"})), "role": {"kind": kind}}
        head[stack] = {
            **plan(stack, resource(VPC, "vpc", inputs={"cidrBlock": "10.2.0.0/16", "x": 1})),
            "role": {"kind": kind},
        }
    result = compare(PlanSet(label="a", plans=base), PlanSet(label="b", plans=head))
    assert result.apply_order == [regional, k8s, world]
    order = "`prod-us-west-2` → `prod-us-west-2-k8s` → `prod-global`"
    assert f"**Apply in this order** (each stack reads the ones before it): {order}" in render.render_markdown(result)


def test_diff_json_carries_blocking_changes_values_and_order(result: Diff) -> None:
    import json

    document = json.loads(json.dumps(render.to_json(result)))  # JSON-ready as it is
    assert document["schema"] == "dlinfra.diff/v1"
    assert {c["name"] for c in document["blocking"]} == {c.name for c in result.blocking}
    assert document["apply_order"] == result.apply_order
    public = next(c for c in document["changes"] if c["name"] == "public-a")
    assert public["action"] == "update" and public["values"]["mapPublicIpOnLaunch"] == "false → true"
    assert set(document) >= {"changes", "lock", "entities", "reach", "cost", "data_loss", "capacity_reductions"}
