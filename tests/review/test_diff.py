"""`dlinfra diff`: the pure comparison over fixture plan sets, its markdown, and one run over real revisions."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlinfra.errors import DlinfraError
from dlinfra.model.fleet import load_fleet
from dlinfra.review.diff import render, revisions
from dlinfra.review.diff.changes import Change, Diff
from dlinfra.review.diff.compare import compare, compare_stack, entity_summary, touched
from dlinfra.review.diff.plans import PlanSet, topology
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

STACK = "prod-us-west-2"
PREFIX = f"urn:pulumi:{STACK}::dlinfra::"


def resource(type_: str, name: str, parent: str = "dlinfra:network:Network", **options: Any) -> dict[str, Any]:
    return {
        "urn": f"{PREFIX}{parent}${type_}::{name}",
        "type": type_,
        "name": name,
        "custom": True,
        "id": f"id-{name}",
        "provider": None,
        "protect": options.get("protect", False),
        "aliases": options.get("aliases", []),
        "replace_on_changes": options.get("replace_on_changes", []),
        "inputs": options.get("inputs", {}),
    }


def plan(stack: str, *resources: dict[str, Any]) -> dict[str, Any]:
    return {"schema": "dlinfra.plan/v1", "stack": stack, "resources": list(resources)}


VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
EFS = "aws:efs/fileSystem:FileSystem"
BUCKET = "aws:s3/bucket:Bucket"
TAGS = {"project": "dlinfra", "owner": "infra"}

BASE_RESOURCES = [
    resource(VPC, "vpc", inputs={"cidrBlock": "10.2.0.0/16", "tags": TAGS}),
    resource(SUBNET, "private-a", inputs={"cidrBlock": "10.2.0.0/18", "availabilityZone": "us-west-2a"}),
    resource(SUBNET, "public-a", inputs={"cidrBlock": "10.2.192.0/24", "mapPublicIpOnLaunch": False, "tags": TAGS}),
    resource(EFS, "home", "dlinfra:storage:Storage", protect=True, inputs={"encrypted": True}),
    resource(BUCKET, "scratch", "dlinfra:storage:Storage", protect=True, inputs={"bucket": "dlinfra-scratch"}),
    resource("aws:iam/role:Role", "old-role", inputs={"name": "r"}),
    resource("aws:ec2/eip:Eip", "nat-eip", "dlinfra:network:Nat", inputs={"domain": "vpc"}),
]
BASE = PlanSet(
    label="main (abc)",
    plans={STACK: plan(STACK, *BASE_RESOURCES), "prod-old-1": plan("prod-old-1", resource(VPC, "vpc"))},
    lock={"vpc/prod/us-west-2": "10.2.0.0/16", "site-lan/sjc1": "10.200.0.0/20"},
    topology=topology(
        {
            "regions": {"us-west-2": {"primary": True}, "us-east-1": {}},
            "environments": {"prod": {"regions": {"us-west-2": {}, "us-east-1": {}}}},
            "sites": {"sjc1": {"region": "us-west-2", "routing": "bgp"}},
        }
    ),
)


def _head() -> PlanSet:
    changed = copy.deepcopy(BASE_RESOURCES)
    changed[0]["inputs"]["cidrBlock"] = "10.9.0.0/16"  # VPC renumbered: replace
    changed[2]["inputs"]["mapPublicIpOnLaunch"] = True  # update
    changed[2]["inputs"]["tags"] = {**TAGS, "owner": "platform"}  # update, shown per tag key
    del changed[4]  # the bucket goes: a stateful deletion
    del changed[5]  # the EIP is re-parented without an alias: replace by URN change
    renamed = resource(
        "aws:iam/role:Role", "new-role", aliases=[f"{PREFIX}dlinfra:network:Network$aws:iam/role:Role::old-role"]
    )
    renamed["inputs"] = {"name": "r"}
    changed[4] = renamed
    moved = resource("aws:ec2/eip:Eip", "nat-eip", "dlinfra:network:Network", inputs={"domain": "vpc"})
    created = resource("aws:ec2/flowLog:FlowLog", "flow-log", inputs={"trafficType": "ALL"})
    return PlanSet(
        label="working tree",
        plans={STACK: plan(STACK, *changed, moved, created), "prod-new-1": plan("prod-new-1", resource(VPC, "vpc"))},
        lock={"vpc/prod/us-west-2": "10.9.0.0/16", "site-lan/ams1": "10.4.0.0/20"},
        topology=topology(
            {
                "regions": {"us-west-2": {"primary": True}, "us-east-1": {}, "eu-west-1": {}},
                "environments": {"prod": {"regions": {"us-west-2": {}, "us-east-1": {}, "eu-west-1": {}}}},
                "sites": {"sjc1": {"region": "us-west-2", "routing": "bgp"}, "ams1": {"region": "eu-west-1"}},
            }
        ),
    )


@pytest.fixture(scope="module")
def result() -> Diff:
    return compare(BASE, _head())


@pytest.fixture(scope="module")
def markdown(result: Diff) -> str:
    return render.render_markdown(result)


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


def test_alias_is_a_rename_not_a_replacement(result: Diff) -> None:
    assert not [c for c in result.changes if c.name in ("old-role", "new-role")]


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


def _node(urn: str, type_: str, parent: str | None, *, custom: bool = True, aliases: tuple[str, ...] = ()) -> dict:
    return {
        "urn": urn,
        "type": type_,
        "name": urn.rsplit("::", 1)[1],
        "custom": custom,
        "parent": parent,
        "aliases": list(aliases),
        "inputs": {"clusterName": "c"},
    }


COMPONENT, EKS = "dlinfra:cluster:Cluster", "aws:eks/cluster:Cluster"
ENTRY, ASSOCIATION = "aws:eks/accessEntry:AccessEntry", "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"


@pytest.mark.parametrize("pulumi_urns", [True, False], ids=["pulumi-urns", "offline-engine-urns"])
def test_moving_children_to_a_new_parent_with_an_alias_changes_nothing(pulumi_urns: bool) -> None:
    """Access entries moved from under the (protected) EKS cluster to the component keep their URNs through
    `Alias(parent=cluster)`; their own children inherit the alias, as the Pulumi engine resolves it."""

    def urn(parent: str | None, type_: str, name: str) -> str:
        if parent is None:
            return f"{PREFIX}{type_}::{name}" if pulumi_urns else f"{PREFIX}pulumi:pulumi:Stack${type_}::{name}"
        chain = parent.split("::")[2]
        return f"{PREFIX}{chain if pulumi_urns else chain.rsplit('$', 1)[1]}${type_}::{name}"

    component = _node(urn(None, COMPONENT, "cluster"), COMPONENT, None, custom=False)
    cluster = _node(urn(component["urn"], EKS, "cluster-eks"), EKS, component["urn"])
    old_entry = _node(urn(cluster["urn"], ENTRY, "cluster-team-a"), ENTRY, cluster["urn"])
    old_policy = _node(urn(old_entry["urn"], ASSOCIATION, "cluster-team-a-policy"), ASSOCIATION, old_entry["urn"])
    entry = _node(urn(component["urn"], ENTRY, "cluster-team-a"), ENTRY, component["urn"])
    entry["aliases"] = [f"parent={cluster['urn']}"]  # as the engine records Alias(parent=cluster)
    policy = _node(urn(entry["urn"], ASSOCIATION, "cluster-team-a-policy"), ASSOCIATION, entry["urn"])
    base = plan(STACK, component, cluster, old_entry, old_policy)
    assert compare_stack(STACK, base, plan(STACK, component, cluster, entry, policy)) == []
    # Without the alias the move is a delete and a create under the same name: reported as a replacement.
    entry["aliases"] = []
    changes = compare_stack(STACK, base, plan(STACK, component, cluster, entry, policy))
    assert ("replace", "cluster-team-a") in {(c.action, c.name) for c in changes}


def test_a_renamed_parent_carries_its_childrens_names() -> None:
    """A component renamed with an alias: children named after it keep their URNs (Pulumi's inherited aliases)."""
    old_component = _node(f"{PREFIX}dlinfra:network:Network::net", "dlinfra:network:Network", None, custom=False)
    old_vpc = _node(f"{PREFIX}dlinfra:network:Network$aws:ec2/vpc:Vpc::net-vpc", VPC, old_component["urn"])
    network = "dlinfra:network:Network"
    component = _node(f"{PREFIX}{network}::network", network, None, custom=False, aliases=("name=net",))
    vpc = _node(f"{PREFIX}dlinfra:network:Network$aws:ec2/vpc:Vpc::network-vpc", VPC, component["urn"])
    changes = compare_stack(STACK, plan(STACK, old_component, old_vpc), plan(STACK, component, vpc))
    assert changes == []


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


def test_touched_stacks(result: Diff) -> None:
    assert [t["stack"] for t in touched(result)] == ["prod-new-1", STACK]
    config_only = compare(
        PlanSet("a", {STACK: plan(STACK)}, configs={STACK: "config: {}"}),
        PlanSet("b", {STACK: plan(STACK)}, configs={STACK: "config: {aws:region: x}"}),
    )
    assert [t["stack"] for t in touched(config_only)] == [STACK]
    assert "Stack config changed: `prod-us-west-2`" in render.render_markdown(config_only)


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


# --- real revisions ---------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.slow
def test_diff_of_two_revisions(tmp_path: Path) -> None:
    """Two commits of a scratch copy of the project: each revision's own preview runs; only the change shows."""
    if shutil.which("git") is None:
        pytest.fail("git is needed for dlinfra diff")
    repo = tmp_path / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, repo / name)
    # The fixture fleet, never the lab's own.
    shutil.copy(REFERENCE_FLEET, repo / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, repo / "cidr-lock.yaml")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "base")
    fleet = repo / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace("owner: infra@lab.example.org", "owner: platform@lab.example.org"))
    kwargs: dict[str, Any] = {"fleet": Path("fleet.yaml"), "lock": Path("cidr-lock.yaml"), "python": sys.executable}
    result = revisions.diff_revisions(repo=repo, base="main", head=None, **kwargs)
    working = render.render_markdown(result)
    assert [t["stack"] for t in touched(result)] == [
        "prod-eu-west-1",
        "prod-global",
        "prod-us-east-1",
        "prod-us-west-2",
        "staging-us-west-2",
    ]
    assert touched(result)[0] == {
        "stack": "prod-eu-west-1",
        "kind": "regional",
        "environment": "prod",
        "region": "eu-west-1",
    }
    # With the head fleet: where each stack runs, and whether a pull request may preview it for real
    # (environments.<env>.ci.pull_request_preview: staging yes, prod no).
    head = load_fleet(fleet).fleet
    annotated = {row["stack"]: row for row in touched(result, head)}
    assert annotated["staging-us-west-2"]["preview"] == "real"
    assert {annotated[s]["preview"] for s in annotated if s.startswith("prod-")} == {"offline"}
    assert {row["runs_on"] for row in annotated.values()} == {"github-hosted"}
    assert "`main (" in working and "→ `working tree`" in working
    assert "`tags.owner`" in working and "[!CAUTION]" not in working
    assert "| `prod-us-west-2` | 0 |" in working and "No allocation added" in working
    with pytest.raises(DlinfraError, match="unknown revision 'nope'"):
        revisions.diff_revisions(repo=repo, base="nope", head="HEAD", **kwargs)


# --- cascades -------------------------------------------------------------------------------------------------
def _reference_sets() -> tuple[PlanSet, PlanSet]:
    from tests import reference

    plans = {name: r.plan("dlinfra") for name, r in reference.runs().items()}
    head = copy.deepcopy(plans)
    (subnet,) = [r for r in head[STACK]["resources"] if r["name"] == "network-private-us-west-2a"]
    subnet["inputs"]["cidrBlock"] = "10.2.0.0/19"  # a renumbered node subnet
    return PlanSet(label="base", plans=plans), PlanSet(label="head", plans=head)


def test_a_replaced_subnet_drags_what_holds_it_along() -> None:
    # Offline ids follow URNs, so without the cascade nothing that holds the subnet would change.
    result = compare(*_reference_sets())
    by_name = {(c.stack, c.name): c for c in result.changes}
    assert by_name[(STACK, "network-private-us-west-2a")].action == "replace"
    # Held through a replacement-forcing input: replaced too, and said why.
    mount = by_name[(STACK, "storage-efs-us-west-2a")]
    assert (mount.action, mount.inputs) == ("replace", ("subnetId",))
    assert mount.note == "cascade: network-private-us-west-2a (prod-us-west-2) is replaced"
    lustre = by_name[(STACK, "storage-lustre")]
    assert lustre.action == "replace" and lustre.inputs == ("subnetIds",)
    assert lustre in result.dangerous  # stateful data lost: shown first
    # Held through an updatable input: an update whose new value is known only after apply.
    cluster = by_name[(STACK, "cluster-eks")]
    assert cluster.action == "update" and "vpcConfig" in cluster.inputs and "known after apply" in cluster.note
    # Transitive: the replaced file system's association follows it.
    assert by_name[(STACK, "storage-lustre-datasets")].note.startswith("cascade: storage-lustre (prod-us-west-2)")
    # Other regions and AZs are untouched.
    assert not [c for c in result.changes if c.stack == "prod-eu-west-1"]
    assert (STACK, "storage-efs-us-west-2b") not in by_name


def test_raising_a_pool_max_shows_the_cost_change() -> None:
    from dlinfra.review import cost

    base, _ = _reference_sets()
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


# --- changes named by fleet entity ---------------------------------------------------------------------------
def test_creates_and_deletes_are_named_by_pool_team_and_site() -> None:
    import yaml

    from tests import reference
    from tests.review.test_diff_golden import _pool_team_site_run  # one offline run of that fleet, shared

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


def test_diff_json_carries_blocking_changes_values_and_order(result: Diff) -> None:
    import json

    document = json.loads(json.dumps(render.to_json(result)))  # JSON-ready as it is
    assert document["schema"] == "dlinfra.diff/v1"
    assert {c["name"] for c in document["blocking"]} == {c.name for c in result.blocking}
    assert document["apply_order"] == result.apply_order
    public = next(c for c in document["changes"] if c["name"] == "public-a")
    assert public["action"] == "update" and public["values"]["mapPublicIpOnLaunch"] == "false → true"
    assert set(document) >= {"changes", "lock", "entities", "reach", "cost", "data_loss", "capacity_reductions"}
