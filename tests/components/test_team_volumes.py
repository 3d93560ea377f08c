"""No inline NFS or host volumes in team namespaces: the ValidatingAdmissionPolicy and its binding, as declared.

The policy's CEL rule is evaluated with cel-python (a CEL implementation; Kubernetes evaluates the same standard
macros `has` and `all`) on the pods a team could submit: the EFA training pod of tests/fixtures/k8s is admitted,
pods with an inline nfs, hostPath, iscsi or EFS CSI volume are refused.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from components import team_volumes
from components.charts.kueue import TEAM_LABEL
from tests import reference as ref
from tests.components import test_efa_pod_security as efa

STACK = "prod-us-west-2-k8s"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _named(policies: list[Any]) -> list[Any]:
    """The volume policy among the stack's admission policies (Kueue's GPU policy is another)."""
    return [p for p in policies if p.inputs["metadata"]["name"] == team_volumes.VOLUME_POLICY]


@pytest.fixture(scope="module")
def admits() -> Callable[[Mapping[str, Any]], bool]:
    """The declared policy's rule as a function of a pod (skips without cel-python locally, fails in CI)."""
    try:
        import celpy
    except ImportError:
        message = "cel-python is not installed (pip install -r requirements.txt)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)
    (policy,) = _named(ref.of_type(ref.runs()[STACK], VAP))
    (validation,) = policy.inputs["spec"]["validations"]
    env = celpy.Environment()
    program = env.program(env.compile(validation["expression"]))

    def evaluate(pod: Mapping[str, Any]) -> bool:
        result = program.evaluate({"object": celpy.json_to_cel(dict(pod))})
        assert isinstance(result, celpy.celtypes.BoolType), result  # an error is not an answer
        return bool(result)

    return evaluate


def _with_volume(volume: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(efa.pod())
    pod["spec"]["volumes"].append({"name": "extra", **volume})
    return pod


def test_the_efa_training_pod_is_admitted(admits: Callable[[Mapping[str, Any]], bool]) -> None:
    assert admits(efa.pod())


@pytest.mark.parametrize(
    "volume",
    [
        {"persistentVolumeClaim": {"claimName": "team"}},
        {"configMap": {"name": "c"}},
        {"secret": {"secretName": "s"}},
        {"projected": {"sources": []}},
        {"downwardAPI": {"items": []}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "efs"}}}},
        {"csi": {"driver": "secrets-store.csi.k8s.io"}},
    ],
)
def test_claims_and_pod_local_volumes_are_admitted(
    admits: Callable[[Mapping[str, Any]], bool], volume: dict[str, Any]
) -> None:
    assert admits(_with_volume(volume))


@pytest.mark.parametrize(
    "volume",
    [
        {"nfs": {"server": "fs-0123.efs.us-west-2.amazonaws.com", "path": "/"}},
        {"hostPath": {"path": "/var/lib/kubelet"}},
        {"iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.x", "lun": 0}},
        {"csi": {"driver": "efs.csi.aws.com", "volumeAttributes": {}}},
    ],
)
def test_inline_network_and_host_volumes_are_refused(
    admits: Callable[[Mapping[str, Any]], bool], volume: dict[str, Any]
) -> None:
    assert not admits(_with_volume(volume))


def test_a_pod_without_volumes_is_admitted(admits: Callable[[Mapping[str, Any]], bool]) -> None:
    pod = copy.deepcopy(efa.pod())
    del pod["spec"]["volumes"]
    assert admits(pod)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector's matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", ()),
            "NotIn": not present or value not in e.get("values", ()),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def test_the_policy_denies_pods_in_every_team_namespace_and_nowhere_else() -> None:
    run = ref.runs()[STACK]
    (policy,) = _named(ref.of_type(run, VAP))
    (binding,) = [b for b in ref.of_type(run, BINDING) if b.inputs["spec"]["policyName"] == team_volumes.VOLUME_POLICY]
    spec = policy.inputs["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and "CREATE" in rule["operations"] and rule["apiGroups"] == [""]
    assert spec["validations"][0]["expression"] == team_volumes.VOLUME_RULE
    assert binding.inputs["spec"]["policyName"] == policy.inputs["metadata"]["name"] == team_volumes.VOLUME_POLICY
    assert binding.inputs["spec"]["validationActions"] == ["Deny"]
    assert policy.urn in binding.dependencies
    selector = binding.inputs["spec"]["matchResources"]["namespaceSelector"]
    fleet = ref.fleet()
    namespaces = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"]
        for r in ref.of_type(run, "kubernetes:core/v1:Namespace")
    }
    assert set(namespaces) == {fleet.team_namespace(t) for t in fleet.teams}
    assert all(_selects(selector, labels) for labels in namespaces.values())
    # kube-system (the CSI node's own pods mount the host) and other system namespaces carry no team label.
    assert not _selects(selector, {"kubernetes.io/metadata.name": "kube-system"})
    assert TEAM_LABEL in str(selector)
