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


# --- the team's claims stay until the fleet drops them ------------------------------------------------------------
class _Authorizer:
    """CEL's `authorizer` for one requester: may it do `verb` on `resource` (group '')? cel-python calls the chain
    group(...).resource(...).check(...).allowed() as functions of the receiver."""

    def __init__(self, grants: set[tuple[str, str]]) -> None:
        self.grants, self.resource, self.verb = grants, "", ""


def _claim_review(
    request: dict[str, Any], old: dict[str, Any], new: dict[str, Any] | None, grants: set[tuple[str, str]]
) -> list[str]:
    import celpy
    from celpy import celtypes

    (policy,) = [
        p for p in ref.of_type(ref.runs()[STACK], VAP) if p.inputs["metadata"]["name"] == team_volumes.CLAIM_POLICY
    ]
    spec = policy.inputs["spec"]
    env = celpy.Environment()

    def resource(a: _Authorizer, name: Any) -> _Authorizer:
        a.resource = str(name)
        return a

    def check(a: _Authorizer, verb: Any) -> _Authorizer:
        a.verb = str(verb)
        return a

    functions = {
        "group": lambda a, _g: a,
        "resource": resource,
        "check": check,
        "allowed": lambda a: celtypes.BoolType((a.resource, a.verb) in a.grants),
    }
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "oldObject": celpy.json_to_cel(old),
        "object": celpy.json_to_cel(new),
        "authorizer": _Authorizer(grants),
    }

    def evaluate(expression: str) -> bool:
        result = env.program(env.compile(expression), functions=functions).evaluate(activation)
        assert isinstance(result, celtypes.BoolType), (expression, result)
        return bool(result)

    if not all(evaluate(c["expression"]) for c in spec["matchConditions"]):
        return []
    activation["variables"] = celpy.json_to_cel({v["name"]: evaluate(v["expression"]) for v in spec["variables"]})
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"])]


def _claim(name: str = "home-bob", *, managed: bool = True) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "pulumi-dlinfra"} if managed else {"app": "scratch"}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "team-language", "labels": labels}}  # fmt: skip


EDIT = {("persistentvolumeclaims", "delete")}  # a team member: `edit` in the team's namespace
ADMIN = EDIT | {("persistentvolumes", "delete")}  # cluster admin, the apply role


@pytest.mark.parametrize(
    ("case", "operation", "old", "new", "grants", "admitted"),
    [
        ("a member deletes another member's home claim", "DELETE", _claim(), None, EDIT, False),
        ("a member deletes the datasets claim", "DELETE", _claim("datasets"), None, EDIT, False),
        ("the apply removes a person the fleet dropped", "DELETE", _claim(), None, ADMIN, True),
        ("a member deletes a claim of their own making", "DELETE", _claim("scratch", managed=False), None, EDIT, True),
        ("a member strips the label, to delete it next", "UPDATE", _claim(), _claim(managed=False), EDIT, False),
        ("a member labels a managed claim otherwise", "UPDATE", _claim(),
         {**_claim(), "metadata": {**_claim()["metadata"], "labels": {**_claim()["metadata"]["labels"], "x": "y"}}},
         EDIT, True),
        ("an admin relabels a claim", "UPDATE", _claim(), _claim(managed=False), ADMIN, True),
    ],
)  # fmt: skip
def test_only_admins_delete_the_teams_claims(
    case: str, operation: str, old: dict[str, Any], new: dict[str, Any] | None, grants: set[tuple[str, str]],
    admitted: bool,
) -> None:  # fmt: skip
    request = {"operation": operation, "namespace": "team-language", "userInfo": {"username": "someone"}}
    failed = _claim_review(request, old, new, grants)
    assert (failed == []) is admitted, (case, failed)


def test_the_claim_policy_is_bound_in_team_namespaces_and_fails_closed() -> None:
    run = ref.runs()[STACK]
    (policy,) = [p for p in ref.of_type(run, VAP) if p.inputs["metadata"]["name"] == team_volumes.CLAIM_POLICY]
    (binding,) = [b for b in ref.of_type(run, BINDING) if b.inputs["spec"]["policyName"] == team_volumes.CLAIM_POLICY]
    spec = policy.inputs["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE", "UPDATE"],
                    "resources": ["persistentvolumeclaims"]}  # fmt: skip
    assert binding.inputs["spec"]["validationActions"] == ["Deny"] and policy.urn in binding.dependencies
    selector = binding.inputs["spec"]["matchResources"]["namespaceSelector"]
    assert _selects(selector, {TEAM_LABEL: "vision"}) and not _selects(selector, {"kubernetes.io/metadata.name": "x"})
    # Every claim the program declares carries the label the policy keys on.
    claims = ref.of_type(run, "kubernetes:core/v1:PersistentVolumeClaim")
    assert claims and all(
        c.inputs["metadata"]["labels"][team_volumes.MANAGED_BY[0]] == team_volumes.MANAGED_BY[1] for c in claims
    )
