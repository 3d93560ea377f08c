"""Resources matched across revisions through aliases, as the Pulumi engine resolves them."""

from __future__ import annotations

import pytest

from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.compare import compare_stack
from tests.review.diff.conftest import PREFIX, STACK, VPC, plan


def test_alias_is_a_rename_not_a_replacement(result: Diff) -> None:
    assert not [c for c in result.changes if c.name in ("old-role", "new-role")]


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
