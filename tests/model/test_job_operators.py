"""The job operators a lab may install: which Kueue kinds each brings, in one order whatever the fleet's."""

from __future__ import annotations

import pytest

from dlinfra.model import job_operators


def test_batch_jobs_only_when_no_operator_is_named() -> None:
    assert job_operators.frameworks({}) == ("batch/job",)


def test_the_order_in_the_fleet_changes_nothing() -> None:
    one = job_operators.frameworks({"kuberay": "ray-system", "jobset": "jobset-system"})
    other = job_operators.frameworks({"jobset": "jobset-system", "kuberay": "ray-system"})
    assert one == other == ("batch/job", "jobset.x-k8s.io/jobset", "ray.io/rayjob", "ray.io/raycluster")


def test_an_unknown_operator_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown argo"):
        job_operators.frameworks({"argo": "argo"})


def test_every_requirement_is_a_known_operator_and_no_kind_comes_twice() -> None:
    for operator in job_operators.OPERATORS.values():
        assert set(operator.requires) <= set(job_operators.OPERATORS) and operator.source
    kinds = job_operators.all_frameworks()
    assert len(set(kinds)) == len(kinds) and kinds[0] == "batch/job"
