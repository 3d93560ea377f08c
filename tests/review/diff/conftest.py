"""Plan sets for the diff's tests: resources and plans built by hand, one base and one head of every kind of
change, and the reference fixture's plans with a renumbered subnet."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dlinfra.review.diff import render
from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet, topology

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


def reference_sets() -> tuple[PlanSet, PlanSet]:
    from tests import reference

    plans = {name: r.plan("dlinfra") for name, r in reference.runs().items()}
    head = copy.deepcopy(plans)
    (subnet,) = [r for r in head[STACK]["resources"] if r["name"] == "network-private-us-west-2a"]
    subnet["inputs"]["cidrBlock"] = "10.2.0.0/19"  # a renumbered node subnet
    return PlanSet(label="base", plans=plans), PlanSet(label="head", plans=head)
