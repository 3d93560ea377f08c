"""Reachability of the reference fleet's dev boxes: each person's laptop reaches their box's SSH over their region's
VPN and nothing else reaches it; each intent breaks when the one rule or route it rests on goes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dlinfra.checks.reach import from_plans, sites
from dlinfra.model import planner
from dlinfra.model.fleet.load import load_fleet
from tests.checks.reach.test_reference import Plans, assert_mutation_fails, evaluate, plans, stack, without
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


def test_the_plans_hold_the_boxes_as_places_with_their_own_address() -> None:
    loaded = load_fleet(REFERENCE_FLEET)
    address_plan = planner.plan(loaded, planner.load_lock(REFERENCE_LOCK))
    all_plans = plans()
    topo = from_plans.build(all_plans, sites.site_sides(loaded.fleet, address_plan, all_plans))
    boxes = {(p.environment, p.name): p for p in topo.places if p.kind == "dev-box"}
    assert sorted(boxes) == [("prod", "alice"), ("staging", "bob")]
    alice = boxes[("prod", "alice")]
    assert alice.address is not None and alice.address.prefixlen == 32 and alice.public_ip is False


def test_every_dev_box_intent_holds() -> None:
    result = evaluate(plans(), "dev-box/")
    assert [f"{f.intent.id}: {f.why}" for f in result.failures] == []
    ids = {i.id for i in result.intents}
    for env, person in (("prod", "alice"), ("staging", "bob")):
        for part in ("ssh", "other-ports", "home", "session-manager", "from-nodes-and-pods", "from-the-internet",
                     "from-other-environments/udp", "from-ci-runners"):  # fmt: skip
            assert f"dev-box/{env}/{person}/{part}" in ids, (person, part)
    # Federated: her team's laptops reach alice's box, the other teams' and the admins' do not (the /32 rule).
    assert "dev-box/prod/alice/from-sites" in ids  # staging has no site
    assert "dev-box/prod/alice/other-groups" in ids
    ssh = next(i for i in result.intents if i.id == "dev-box/prod/alice/ssh")
    assert [s.label.split(" on ")[0] for s in ssh.sources] == ["laptop of team vision"]
    assert all(" prod-us-west-2 " in s.label for s in ssh.sources)  # her region's endpoint only


def _ssh_rule_from(cidr: str) -> Callable[[Plans], None]:
    def edit(all_plans: Plans) -> None:
        for r in stack(all_plans, "prod-us-west-2")["resources"]:
            if r["name"] == "devbox-alice-sg-ssh-from-laptops":
                r["inputs"].pop("referencedSecurityGroupId")
                r["inputs"]["cidrIpv4"] = cidr

    return edit


MUTATIONS = [
    pytest.param(
        without("prod-us-west-2", "devbox-alice-sg-ssh-from-laptops"),
        "dev-box/prod/alice/ssh",
        "security group devbox-alice-sg",
        "no ingress rule admits",
        id="no-ssh-rule",
    ),
    pytest.param(
        without("prod-us-west-2", "devbox-alice-sg-to-efs"),
        "dev-box/prod/alice/home",
        "devbox-alice-sg",
        "",
        id="no-nfs-egress",
    ),
]


@pytest.mark.parametrize(("edit", "intent", "hop", "reason"), MUTATIONS)
def test_removing_what_a_box_depends_on_fails_it_at_that_hop(
    edit: Callable[[Plans], None], intent: str, hop: str, reason: str
) -> None:
    assert_mutation_fails(edit, intent, hop, reason)


def test_without_its_own_rule_other_teams_reach_the_box() -> None:
    """The /32 authorization rule is what keeps other groups off the box: without it, the other teams' VPC-wide
    rules admit them to it (the security group cannot tell the endpoint's users apart)."""
    mutated = plans()
    without("prod-us-west-2", "devbox-alice-authorize-vision")(mutated)
    result = evaluate(mutated, "dev-box/prod/alice/other-groups")
    assert result.failures and result.failures[0].why.startswith("reaches it, but must stay closed")
    assert not evaluate(mutated, "dev-box/prod/alice/ssh").failures  # her team's VPC-wide rule still admits her


def test_an_ssh_rule_for_the_vpc_lets_pods_in() -> None:
    mutated = plans()
    _ssh_rule_from("10.2.0.0/16")(mutated)
    result = evaluate(mutated, "dev-box/prod/alice/from-nodes-and-pods")
    assert result.failures and "must stay closed" in result.failures[0].why
    # And the laptops' own rule is gone with it: Client VPN's NAT source is the endpoint's interface, in the VPC,
    # so the VPC rule still lets them in; a rule for the client CIDR would not (next test).
    assert not evaluate(mutated, "dev-box/prod/alice/ssh").failures


def test_a_rule_for_the_client_cidr_matches_nothing_after_the_vpns_nat() -> None:
    mutated = plans()
    client_cidr = next(
        r["inputs"]["clientCidrBlock"]
        for r in stack(mutated, "prod-us-west-2")["resources"]
        if r["type"] == "aws:ec2clientvpn/endpoint:Endpoint"
    )
    _ssh_rule_from(client_cidr)(mutated)
    result = evaluate(mutated, "dev-box/prod/alice/ssh")
    assert result.failures and "devbox-alice-sg" in result.failures[0].verdict.denied_at
