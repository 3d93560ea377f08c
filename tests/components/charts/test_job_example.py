"""The example job of docs/jobs.md is one a researcher can copy: a valid Job for the cluster's Kubernetes version,
whose pods the checkpoint grace policy admits on the reference training pool, and which keeps the contract's parts
(a grace, the podFailurePolicy that does not count disruptions as failures)."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests import reference as ref
from tests.components.charts.test_checkpoint_grace import _request, _review, policy  # noqa: F401 (fixture)
from tests.conftest import ROOT

GUIDE = ROOT / "docs" / "jobs.md"


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), flags=re.S)
    jobs = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "Job"]
    assert len(jobs) == 1, "docs/jobs.md: one example Job"
    return jobs[0]


def _pod_of(job: dict[str, Any], pool: str) -> dict[str, Any]:
    """The pod the Job controller creates once Kueue admitted the job to a pool's flavor (its node selector)."""
    spec = copy.deepcopy(job["spec"]["template"]["spec"])
    spec.setdefault("nodeSelector", {})["dlinfra.io/pool"] = pool
    meta = {"name": f"{job['metadata']['name']}-0", "namespace": job["metadata"]["namespace"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_the_example_is_a_valid_job(job: dict[str, Any]) -> None:
    version = ref.fleet().environments["prod"].kubernetes.version
    kubernetes_validate.validate(job, version, strict=True)
    assert job["metadata"]["namespace"] == ref.fleet().team_namespace("language")


def test_the_example_keeps_the_contract(job: dict[str, Any]) -> None:
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 30, "the kubelet's default 30 s is no checkpoint grace"
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules


def test_the_policy_admits_the_example_and_refuses_a_longer_grace(job: dict[str, Any], policy: dict[str, Any]) -> None:  # noqa: F811
    request = _request("CREATE") | {"namespace": job["metadata"]["namespace"]}
    assert _review(policy, request, _pod_of(job, "train-h100")) == []
    greedy = copy.deepcopy(job)
    greedy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 3600
    assert _review(policy, request, _pod_of(greedy, "train-h100")) != []
