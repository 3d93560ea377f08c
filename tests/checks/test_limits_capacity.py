"""The quotas a GPU fleet meets first (dlinfra.checks.limits): EC2 vCPUs per instance family and market, network
interfaces per region, Lambda concurrency and CodeBuild's concurrent builds, on small hand-made plans."""

from __future__ import annotations

from typing import Any

from dlinfra.checks import runner
from dlinfra.checks.limits import check as limits
from dlinfra.checks.limits.scope import Config
from tests.checks.test_limits import ASG, LT, Plan, Stack, _one, _verdicts
from tests.conftest import ROOT


def _pool(s: Stack, name: str, instance_type: str, max_size: int, **template: Any) -> None:
    lt = s.add(LT, f"{name}-lt", instanceType=instance_type, **template)
    s.add(ASG, f"{name}-asg", name=name, maxSize=float(max_size), launchTemplate={"id": lt})


def _spot_pool(s: Stack, name: str, types: list[str], max_size: int, base: int, share: int) -> None:
    lt = s.add(LT, f"{name}-lt")
    s.add(
        ASG,
        f"{name}-asg",
        name=name,
        maxSize=float(max_size),
        mixedInstancesPolicy={
            "instancesDistribution": {
                "onDemandBaseCapacity": float(base),
                "onDemandPercentageAboveBaseCapacity": float(share),
            },
            "launchTemplate": {
                "launchTemplateSpecification": {"launchTemplateId": lt},
                "overrides": [{"instanceType": t} for t in types],
            },
        },
    )


def test_each_pool_counts_its_vcpus_against_its_familys_quota_on_demand_or_spot() -> None:
    # Amazon EC2 instance type quotas: vCPUs per family group and market, per account and region.
    s = Stack("prod-us-west-2")
    _pool(s, "train", "p4d.24xlarge", 4)  # 96 vCPUs each
    _pool(s, "interactive", "g6.12xlarge", 2)  # 48
    # 2 on demand, then 10% of the 18 above: 2 on demand (rounded up) and 17 spot (rounded down), at 16 vCPUs.
    _spot_pool(s, "cpu", ["m7i.2xlarge", "m7i.4xlarge"], 20, base=2, share=10)
    staging = Stack("staging-us-west-2", environment="staging")
    _pool(staging, "train", "p5.48xlarge", 1)  # same account and region: adds up
    plans: list[Plan] = [s.plan, staging.plan]
    raised = Config(raised={"L-417A185B": 2000, "L-DB2E81BA": 200, "L-1216C47A": 100, "L-34B43A08": 400})
    used = {v.quota.key: v.usage.used for v in limits.analyse(plans, raised).verdicts if v.quota.market}
    assert used == {
        "ec2-on-demand-p-vcpus": 4 * 96 + 192,
        "ec2-on-demand-g-vt-vcpus": 2 * 48,
        "ec2-on-demand-standard-vcpus": 4 * 16,
        "ec2-spot-standard-vcpus": 17 * 16,
        "ec2-spot-g-vt-vcpus": 0,
        "ec2-spot-p-vcpus": 0,
        "ec2-spot-p5-vcpus": 0,
    }
    p = _one(plans, "ec2-on-demand-p-vcpus", raised)
    assert p.usage.how == "on-demand vCPUs: prod-us-west-2 train 4 x 96, staging-us-west-2 train 1 x 192"
    assert (p.limit, p.state) == (2000, "ok")


def test_reserved_capacity_counts_on_demand_and_a_capacity_block_does_not() -> None:
    # "On-Demand Capacity Reservations", Quotas: reservations count towards the On-Demand Instance quota.
    # Capacity Blocks have quotas of their own, met when the block is bought ("Amazon EC2 instance type quotas").
    s = Stack("prod-us-east-1")
    reservation = {"capacityReservationSpecification": {"capacityReservationTarget": {"capacityReservationId": "cr-1"}}}
    _pool(s, "reserved", "p5.48xlarge", 2, **reservation)
    _pool(s, "block", "p5.48xlarge", 8, instanceMarketOptions={"marketType": "capacity-block"}, **reservation)
    verdict = _one([s.plan], "ec2-on-demand-p-vcpus", Config(raised={"L-417A185B": 1000}))
    assert verdict.usage.used == 2 * 192
    assert "block on a Capacity Block, not counted" in verdict.usage.how


def test_a_quota_new_accounts_have_at_zero_is_exceeded_by_one_instance_and_the_finding_says_how_to_raise_it() -> None:
    s = Stack("prod-us-west-2")
    _pool(s, "interactive", "g6.xlarge", 1)
    verdict = _one([s.plan], "ec2-on-demand-g-vt-vcpus")
    assert (verdict.usage.used, verdict.limit, verdict.state, verdict.blocking) == (4, 0, "over", False)
    message = verdict.message()
    assert message.startswith("4 of 0 exceeds Running On-Demand G and VT instances in us-west-2 (the shared account)")
    assert "--service-code ec2 --quota-code L-DB2E81BA --desired-value 5" in message
    assert "then write the value AWS applied in the fleet (quotas: {L-DB2E81BA: 5}" in message
    (finding,) = [
        f
        for f in runner.limit_findings(limits.analyse([s.plan], Config()), runner.SourceIndex(ROOT))
        if f.rule == "limit-ec2-on-demand-g-vt-vcpus"
    ]
    assert not finding.blocking  # AWS raises it: a warning, with the request to make
    # A pool of size 0 uses none of it.
    empty = Stack("prod-us-west-2")
    _pool(empty, "interactive", "g6.xlarge", 0)
    assert _one([empty.plan], "ec2-on-demand-g-vt-vcpus").state == "ok"


def test_network_interfaces_count_every_node_at_max_pods_and_one_per_efa_card() -> None:
    s = Stack("prod-us-west-2")
    cards = [{"networkCardIndex": float(c), "deviceIndex": float(min(c, 1))} for c in range(32)]
    _pool(s, "train", "p5.48xlarge", 4, networkInterfaces=cards)  # CNI's 2 on card 0, 31 EFA on the other cards
    _pool(s, "cpu", "m7i.4xlarge", 10)  # 8 each
    s.add("aws:ec2/vpcEndpoint:VpcEndpoint", "sts", vpcEndpointType="Interface", subnetIds=["a", "b", "c"])
    s.add("aws:efs/mountTarget:MountTarget", "mt", subnetId="a")
    s.add("aws:ec2/routeTableAssociation:RouteTableAssociation", "rta", subnetId="a")  # no interface
    verdict = _one([s.plan], "network-interfaces-per-region")
    assert verdict.usage.used == 4 * 33 + 10 * 8 + 3 + 1
    assert (verdict.limit, verdict.quota.code) == (5000, "L-DF5E4CA3")


def test_lambda_reservations_and_the_100_kept_unreserved_count_against_the_accounts_concurrency() -> None:
    # Lambda developer guide, "Configuring reserved concurrency": up to the unreserved concurrency minus 100.
    s = Stack("prod-us-west-2")
    s.add("aws:lambda/function:Function", "handler", name="handler", reservedConcurrentExecutions=10.0)
    s.add("aws:lambda/function:Function", "sweep", name="sweep", reservedConcurrentExecutions=-1.0)
    s.add("aws:lambda/function:Function", "other", name="other")
    verdict = _one([s.plan], "lambda-concurrent-executions")
    assert (verdict.usage.used, verdict.limit, verdict.state) == (110, 1000, "ok")
    assert verdict.usage.how == "reserved: handler 10; 100 kept unreserved"
    # A new account with 50: even the handler's 10 cannot be reserved.
    small = _one([s.plan], "lambda-concurrent-executions", Config(raised={"L-B99A9384": 50}))
    assert small.state == "over" and "raised to 50 in the fleet (AWS default 1000)" in small.message()


def test_functions_that_reserve_nothing_are_not_counted() -> None:
    # The 100 kept unreserved bounds reservations only ("Configuring reserved concurrency"): a region whose functions
    # all draw on the unreserved pool fails nothing, even on a new account's 10.
    s = Stack("prod-us-west-2")
    s.add("aws:lambda/function:Function", "sweep", name="sweep", reservedConcurrentExecutions=-1.0)
    s.add("aws:lambda/function:Function", "other", name="other")
    s.add("aws:lambda/function:Function", "off", name="off", reservedConcurrentExecutions=0.0)  # throttled: holds 0
    assert _verdicts([s.plan], "lambda-concurrent-executions", Config(raised={"L-B99A9384": 10})) == []


def test_a_build_projects_limit_is_judged_against_its_compute_types_concurrent_builds_quota() -> None:
    # terraform-provider-aws PR 37748: "Project-level concurrent build limit cannot exceed the account-level
    # concurrent build limit of 1". A project without a limit needs one build: the rest queue against the quota
    # (CodeBuild user guide, "Builds in AWS CodeBuild"), and at 0 none starts ("Cannot have more than 0 builds in
    # queue for the account", which new accounts report: the table's default is 0).
    s = Stack("prod-us-west-2")
    small = {"type": "LINUX_CONTAINER", "computeType": "BUILD_GENERAL1_SMALL"}
    s.add("aws:codebuild/project:Project", "two", name="two", concurrentBuildLimit=2.0, environment=small)
    s.add("aws:codebuild/project:Project", "one", name="one", concurrentBuildLimit=1.0, environment=small)
    s.add("aws:codebuild/project:Project", "unlimited", name="unlimited", environment=small)  # queues instead
    large = {"type": "LINUX_CONTAINER", "computeType": "BUILD_GENERAL1_LARGE"}  # another quota, not in the table
    s.add("aws:codebuild/project:Project", "big", name="big", concurrentBuildLimit=4.0, environment=large)
    new_account = {v.usage.scope: v for v in _verdicts([s.plan], "codebuild-linux-small-builds")}
    assert {scope: v.state for scope, v in new_account.items()} == {
        "build project two": "over",
        "build project one": "over",
        "build project unlimited": "over",
    }
    unlimited = new_account["build project unlimited"]
    assert unlimited.usage.used == 1 and not unlimited.blocking  # AWS raises it: a warning with the request
    assert (
        unlimited.usage.how == "no project limit: one build at a time at least, the rest queue (BUILD_GENERAL1_SMALL)"
    )
    one = _verdicts([s.plan], "codebuild-linux-small-builds", Config(raised={"L-9D07B6EF": 1}))
    assert {v.usage.scope: v.state for v in one} == {
        "build project two": "over",
        "build project one": "near",
        "build project unlimited": "near",
    }
    raised = _verdicts([s.plan], "codebuild-linux-small-builds", Config(raised={"L-9D07B6EF": 5}))
    assert {v.state for v in raised} == {"ok"}
