"""Stack roles: which in-cluster stacks the in-VPC runners would take from a given GitHub account."""

from __future__ import annotations

from dlinfra.model import ci, stackroles
from dlinfra.model.fleet.load import load_fleet
from tests.conftest import REFERENCE_FLEET

FLEET = load_fleet(REFERENCE_FLEET).fleet
LISTED = 9919  # in both environments' ci.runner_actor_ids
STRANGER = 4242


def _roles(*names: str) -> list[stackroles.StackRole]:
    return [stackroles.parse(FLEET, n) for n in names]


def test_a_listed_account_is_taken_for_every_in_cluster_stack() -> None:
    assert stackroles.runner_refusals(FLEET, stackroles.roles(FLEET), LISTED) == []


def test_an_unlisted_account_is_refused_per_environment_naming_the_key_and_the_stacks() -> None:
    # The webhook admits nothing from it (ci.webhook_filters' ACTOR_ACCOUNT_ID): its k8s jobs would stay queued
    # until GitHub cancels them, 24 to 48 hours (GitHub docs, "Usage limits for self-hosted runners").
    prod_ci = FLEET.environments["prod"].ci
    assert prod_ci is not None
    job = ci.WorkflowJob("apply", "refs/heads/main", actor_id=STRANGER)
    assert not ci.admits([ci.webhook_filters("apply", actor_ids=prod_ci.runner_actor_ids)], job)
    refusals = stackroles.runner_refusals(FLEET, stackroles.roles(FLEET), STRANGER)
    assert [key for key, _ in refusals] == [
        "environments.prod.ci.runner_actor_ids",
        "environments.staging.ci.runner_actor_ids",
    ]
    problem = dict(refusals)["environments.staging.ci.runner_actor_ids"]
    assert problem.startswith("GitHub account 4242 started this run, and the apply runner takes jobs from 583231, 9919")
    assert "staging-us-west-2-k8s would wait 24 to 48 hours" in problem


def test_stacks_on_github_hosted_runners_need_no_listed_account() -> None:
    assert stackroles.runner_refusals(FLEET, _roles("prod-us-west-2", "prod-global"), STRANGER) == []
    (refusal,) = stackroles.runner_refusals(FLEET, _roles("prod-us-west-2-k8s"), STRANGER)
    assert refusal[0] == "environments.prod.ci.runner_actor_ids" and "prod-us-west-2-k8s would" in refusal[1]


def test_an_environment_without_a_runner_is_refused_for_anyone() -> None:
    bare = FLEET.model_copy(
        update={
            "environments": {**FLEET.environments, "prod": FLEET.environments["prod"].model_copy(update={"ci": None})}
        }
    )
    (refusal,) = stackroles.runner_refusals(bare, _roles("prod-eu-west-1-k8s"), LISTED)
    assert refusal == (
        "environments.prod",
        "no `ci`, so no in-VPC runner takes prod-eu-west-1-k8s: apply it over the laptop VPN "
        "(scripts/bootstrap-region.sh)",
    )


def test_a_stack_needs_what_its_dependencies_read_too() -> None:
    from dlinfra.model.stackroles import StackRole, dependencies, with_dependencies

    fleet = load_fleet(REFERENCE_FLEET).fleet
    manager = StackRole("k8s", "prod", fleet.multikueue_manager("prod"))
    workers = fleet.multikueue_workers("prod")
    assert workers, "the reference fleet overflows to another region"
    direct = set(dependencies(fleet, manager))
    needed = with_dependencies(fleet, [manager])
    # The workers' in-cluster stacks read their own regions' stacks, which the manager does not read itself.
    assert {StackRole("regional", "prod", w) for w in workers} <= needed - direct
    assert needed == direct | {manager} | {StackRole("regional", "prod", w) for w in workers}
