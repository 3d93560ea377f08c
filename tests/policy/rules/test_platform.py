"""The platform rules: team namespaces' Pod Security, MultiKueue wiring, no toleration of drain taints, capacity that
arrives whole (rules/provisioning.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.model.fleet.labels import DRAIN_TAINT_KEYS
from policy.dlinfra_policy.rules.core import Resource
from policy.dlinfra_policy.rules.platform import (
    HELM_RELEASE,
    K8S_NAMESPACE,
    KUEUE_CUSTOM,
    MULTIKUEUE_CONTROLLER,
    PSA_ENFORCE,
    RESOURCE_FLAVOR,
    TEAM_LABEL,
    VAP,
    VAP_BINDING,
    drain_taints_not_tolerated,
    gpu_pods_queued,
    multikueue_wired,
    team_namespaces_have_local_queue,
    team_namespaces_pod_security,
    team_namespaces_volume_policy,
    tolerates,
)
from policy.dlinfra_policy.rules.provisioning import (
    ATOMIC_CLASS,
    CRD_TYPE,
    PROVISIONING_CONTROLLER,
    PROVREQ_CRD,
    gpu_queues_provision_whole,
)
from tests.policy.rules._resources import CTX, pass_and_fail, res

MAINTENANCE = "aws-node-termination-handler/scheduled-maintenance"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
JOB = "kubernetes:batch/v1:Job"
TEAM_NS = {TEAM_LABEL: "a", "pod-security.kubernetes.io/warn": "restricted"}

TEAM_A = res(K8S_NAMESPACE, "ns-a")(metadata={"name": "team-a", "labels": TEAM_NS | {PSA_ENFORCE: "baseline"}})
VOLUME_POLICY = res(VAP, "vap")(
    metadata={"name": "team-volumes"},
    spec={
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                                "resources": ["pods"]}]},
        "validations": [{"expression": "object.spec.volumes.all(v, !has(v.nfs))"}],
    },
)  # fmt: skip


CLUSTER_QUEUE_A = res(f"{KUEUE_CUSTOM}ClusterQueue", "cq")(metadata={"name": "a"}, spec={"resourceGroups": []})


def local_queue(namespace: str, cluster_queue: str = "a") -> Resource:
    return res(f"{KUEUE_CUSTOM}LocalQueue", f"lq-{namespace}")(
        metadata={"name": "default", "namespace": namespace}, spec={"clusterQueue": cluster_queue}
    )


def binding(actions: list[str], selector: dict[str, object] | None = None, policy: str = "team-volumes") -> Resource:
    match = {"namespaceSelector": selector or {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}}
    return res(VAP_BINDING, "vapb")(
        metadata={"name": "team-volumes"},
        spec={"policyName": policy, "validationActions": actions, "matchResources": match},
    )


# A stack with a team namespace, Kueue queueing its pods and the admission policy behind it (spelled out here, not
# taken from the components, so the rule is checked against what Kueue and Kubernetes read).
TEAM_SELECTOR = {"matchExpressions": [{"key": "dlinfra.io/team", "operator": "Exists"}]}
KUEUE_CONFIG = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
    "kind": "Configuration",
    "manageJobsWithoutQueueName": True,
    "managedJobsNamespaceSelector": TEAM_SELECTOR,
    "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset", "pod", "deployment", "statefulset"]},
}
GATE_CHECK = (
    "has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, g.name == 'kueue.x-k8s.io/admission')"
)


def _kueue_release(config: dict[str, Any] | None = None) -> Resource:
    import yaml

    values = {"managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config or KUEUE_CONFIG)}}
    return res(HELM_RELEASE, "kueue")(name="kueue", chart="oci://registry.k8s.io/kueue/charts/kueue", values=values)


def _gate_policy(**spec: Any) -> Resource:
    base = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": TEAM_SELECTOR,
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
            ],
        },
        "variables": [{"name": "gated", "expression": GATE_CHECK}],
        "validations": [{"expression": "variables.gated", "message": "queue it"}],
    }
    return res(VAP, "gpu")(metadata={"name": "gpu"}, spec=base | spec)


def _binding(*actions: str, policy: str = "gpu") -> Resource:
    return res(VAP_BINDING, f"{policy}-binding")(
        metadata={"name": policy}, spec={"policyName": policy, "validationActions": list(actions)}
    )


OWNER_CHECK = (
    "!(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.controller) && "
    "o.controller)) || request.userInfo.username.startsWith('system:serviceaccount:kube-system:')"
)


def _owner_policy(resources: tuple[tuple[str, str], ...] = (("batch", "jobs"), ("jobset.x-k8s.io", "jobsets")),
                  **spec: Any) -> Resource:  # fmt: skip
    """Who may set a job's controller ownerReference, over the given (API group, resource) pairs."""
    base = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": TEAM_SELECTOR,
            "resourceRules": [
                {"apiGroups": [g], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": [r]}
                for g, r in resources
            ],
        },
        "validations": [{"expression": OWNER_CHECK, "message": "only controllers"}],
    }
    return res(VAP, "owners")(metadata={"name": "owners"}, spec=base | spec)


TEAM_NAMESPACE = res(K8S_NAMESPACE, "ns")(metadata={"name": "team-a", "labels": TEAM_NS | {PSA_ENFORCE: "baseline"}})
OWNERS = [_owner_policy(), _binding("Deny", policy="owners")]
QUEUED = [TEAM_NAMESPACE, _kueue_release(), _gate_policy(), _binding("Deny"), *OWNERS]


def _whole(
    *, on_flavors: list[str] | None = None, provreq: bool = True, crd: bool = True, timeout: str = "30m",
    check: bool = True,
) -> list[Resource]:  # fmt: skip
    """A stack with a cloud pool flavor and a site flavor in a team queue, and what makes the pool's jobs whole."""
    checks = [{"name": "whole"} | ({"onFlavors": on_flavors} if on_flavors is not None else {})] if check else []
    out = [
        res(RESOURCE_FLAVOR, "fp")(metadata={"name": "pool-p"}, spec={"nodeLabels": {"dlinfra.io/pool": "p"}}),
        res(RESOURCE_FLAVOR, "fs")(metadata={"name": "site-s"}, spec={"nodeLabels": {"dlinfra.io/site": "s"}}),
        res(f"{KUEUE_CUSTOM}AdmissionCheck", "ac")(
            metadata={"name": "whole"},
            spec={
                "controllerName": PROVISIONING_CONTROLLER,
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "whole"},
            },
        ),
        res(f"{KUEUE_CUSTOM}ProvisioningRequestConfig", "prc")(
            metadata={"name": "whole"}, spec={"provisioningClassName": ATOMIC_CLASS}
        ),
        res(f"{KUEUE_CUSTOM}ClusterQueue", "cq")(
            metadata={"name": "a"},
            spec={
                "cohortName": "research",
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                    {"name": "pool-p", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]},
                    {"name": "site-s", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]},
                ]}],
                **({"admissionChecksStrategy": {"admissionChecks": checks}} if checks else {}),
            },
        ),
        res(HELM_RELEASE, "ca")(
            name="cluster-autoscaler", chart="cluster-autoscaler",
            values={"extraArgs": {"max-node-provision-time": "25m"}
                    | ({"enable-provisioning-requests": "true"} if provreq else {})},
        ),
        _kueue_release(KUEUE_CONFIG | {"waitForPodsReady": {"timeout": timeout}}),
    ]  # fmt: skip
    if crd:
        out.append(res(CRD_TYPE, "crd")(metadata={"name": PROVREQ_CRD}, spec={}))
    return out


# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "team-namespaces-pod-security": (
        [
            res(K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS | {PSA_ENFORCE: "baseline"}}),
            res(K8S_NAMESPACE)(metadata={"name": "kube-system"}),
        ],
        [res(K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS | {PSA_ENFORCE: "privileged"}})],
    ),
    "drain-taints-not-tolerated": (
        [
            res(RESOURCE_FLAVOR)(spec={"nodeLabels": {"dlinfra.io/pool": "train"}, "nodeTaints": [GPU_TAINT]}),
            res(RESOURCE_FLAVOR)(spec={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}),
            res(JOB)(spec={"template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}}),
            # DaemonSets belong on every node, and drains leave them alone.
            res("kubernetes:apps/v1:DaemonSet")(spec={"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}),
        ],
        [
            res(RESOURCE_FLAVOR)(spec={"tolerations": [{"operator": "Exists"}]}),
            res(RESOURCE_FLAVOR)(spec={"nodeTaints": [{"key": MAINTENANCE, "effect": "NoSchedule"}]}),
            res(JOB)(spec={"template": {"spec": {"tolerations": [{"key": MAINTENANCE, "operator": "Exists"}]}}}),
            res("kubernetes:batch/v1:CronJob")(
                spec={"jobTemplate": {"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}}}
            ),
        ],
    ),
    "gpu-pods-queued": (
        [
            *QUEUED,
            res(K8S_NAMESPACE, "kube-system")(metadata={"name": "kube-system"}),
        ],
        [
            TEAM_NAMESPACE,
            _kueue_release(KUEUE_CONFIG | {"integrations": {"frameworks": ["batch/job"]}}),
            _gate_policy(),
            _binding("Deny"),
            *OWNERS,
        ],
    ),
    "multikueue-wired": (
        [
            res(f"{KUEUE_CUSTOM}AdmissionCheck", "c")(
                metadata={"name": "c"},
                spec={
                    "controllerName": MULTIKUEUE_CONTROLLER,
                    "parameters": {"kind": "MultiKueueConfig", "name": "c"},
                },
            ),
            res(f"{KUEUE_CUSTOM}MultiKueueConfig", "k")(metadata={"name": "c"}, spec={"clusters": ["w"]}),
            res(f"{KUEUE_CUSTOM}MultiKueueCluster", "w")(
                metadata={"name": "w"},
                spec={"clusterSource": {"kubeConfig": {"location": "s", "locationType": "Secret"}}},
            ),
        ],
        [
            res(f"{KUEUE_CUSTOM}AdmissionCheck", "c")(
                metadata={"name": "c"},
                spec={
                    "controllerName": MULTIKUEUE_CONTROLLER,
                    "parameters": {"kind": "MultiKueueConfig", "name": "c"},
                },
            ),
        ],
    ),
    "team-namespaces-volume-policy": (
        [TEAM_A, VOLUME_POLICY, binding(["Deny"])],
        [TEAM_A, VOLUME_POLICY, binding(["Audit"])],
    ),
    "team-namespaces-have-local-queue": (
        [TEAM_A, CLUSTER_QUEUE_A, local_queue("team-a"), res(K8S_NAMESPACE, "kube-system")(metadata={"name": "x"})],
        [TEAM_A, CLUSTER_QUEUE_A, local_queue("team-b")],
    ),
    "gpu-queues-provision-whole": (_whole(on_flavors=["pool-p"]), _whole(on_flavors=["site-s"])),
}


@pytest.mark.parametrize(
    ("stack", "problem"),
    [
        (_whole(check=False), "flavors pool-p are autoscaled GPU pools without the provisioning check"),
        (_whole(on_flavors=["site-s"]), "flavors pool-p are autoscaled GPU pools without the provisioning check"),
        (_whole(provreq=False), "enable-provisioning-requests is not true"),
        (_whole(crd=False), f"no CustomResourceDefinition {PROVREQ_CRD}"),
        (_whole(timeout="20m"), "waitForPodsReady.timeout '20m' must exceed"),
        (_whole(timeout="25m"), "waitForPodsReady.timeout '25m' must exceed"),
        (_whole(timeout="soon"), "waitForPodsReady.timeout 'soon' must exceed"),
    ],
)
def test_gpu_queues_provision_whole_names_each_missing_piece(stack: list[Resource], problem: str) -> None:
    (violation,) = gpu_queues_provision_whole(stack, CTX)
    assert problem in violation.message


def test_gpu_queues_provision_whole_passes_a_check_on_every_flavor_and_site_only_queues() -> None:
    assert gpu_queues_provision_whole(_whole(), CTX) == []  # no onFlavors: the check runs for every flavor
    assert gpu_queues_provision_whole(_whole(on_flavors=["pool-p"], timeout="1h"), CTX) == []
    sites_only = [r for r in _whole(check=False, provreq=False, crd=False) if r.name != "fp"]
    assert gpu_queues_provision_whole(sites_only, CTX) == []  # no autoscaler behind a site: nothing to provision


def test_a_local_queue_must_feed_a_declared_cluster_queue() -> None:
    assert team_namespaces_have_local_queue([TEAM_A, CLUSTER_QUEUE_A, local_queue("team-a")], CTX) == []
    (missing,) = team_namespaces_have_local_queue([TEAM_A, CLUSTER_QUEUE_A], CTX)
    assert "team namespace team-a: no LocalQueue 'default'" in missing.message
    (dangling,) = team_namespaces_have_local_queue([TEAM_A, local_queue("team-a")], CTX)
    assert "feeds ClusterQueue 'a', which this stack does not declare" in dangling.message
    other_name = res(f"{KUEUE_CUSTOM}LocalQueue", "lq2")(
        metadata={"name": "overflow", "namespace": "team-a"}, spec={"clusterQueue": "a"}
    )
    assert len(team_namespaces_have_local_queue([TEAM_A, CLUSTER_QUEUE_A, other_name], CTX)) == 1


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_team_namespace_without_an_enforced_level_is_flagged() -> None:
    unset = res(K8S_NAMESPACE)(metadata={"name": "team-a", "labels": TEAM_NS})
    (message,) = team_namespaces_pod_security(unset, CTX)
    assert "unset, which admits privileged pods" in message
    restricted = res(K8S_NAMESPACE)(metadata={"labels": TEAM_NS | {PSA_ENFORCE: "restricted"}})
    assert team_namespaces_pod_security(restricted, CTX) == []


def _kueue(kind: str, name: str, spec: dict[str, Any]) -> Resource:
    return res(f"{KUEUE_CUSTOM}{kind}", name)(metadata={"name": name}, spec=spec)


def test_multikueue_wiring_is_checked() -> None:
    from components.charts import multikueue

    check = _kueue("AdmissionCheck", "overflow-a", multikueue.overflow_admission_check_spec("a"))
    config = _kueue("MultiKueueConfig", "overflow-a", multikueue.multikueue_config_spec(["us-east-1"]))
    cluster = _kueue("MultiKueueCluster", "us-east-1", multikueue.multikueue_cluster_spec("us-east-1"))
    queue_spec = multikueue.overflow_cluster_queue_spec("a", "team-a", 8)
    queue = _kueue("ClusterQueue", "a-overflow", queue_spec)
    assert multikueue_wired([check, config, cluster, queue], CTX) == []
    per_flavor = _kueue(
        "ClusterQueue",
        "a-overflow",
        queue_spec | {"admissionChecksStrategy": {"admissionChecks": [{"name": "overflow-a", "onFlavors": ["x"]}]}},
    )
    (found,) = multikueue_wired([check, config, cluster, per_flavor], CTX)
    assert "limited to some flavors" in found.message
    (orphan,) = multikueue_wired([check, config, queue], CTX)
    assert orphan.message == "MultiKueueConfig overflow-a: no MultiKueueCluster us-east-1"
    path = _kueue(
        "MultiKueueCluster", "us-east-1", {"clusterSource": {"kubeConfig": {"location": "/x", "locationType": "Path"}}}
    )
    (by_path,) = multikueue_wired([check, config, path, queue], CTX)
    assert "not a Secret" in by_path.message
    assert MULTIKUEUE_CONTROLLER == multikueue.MULTIKUEUE_CONTROLLER


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),  # the handler's taints are NoSchedule
        ({"key": MAINTENANCE, "operator": "Exists"}, True),
        ({"key": MAINTENANCE, "operator": "Equal", "value": "x"}, True),  # the value is the event id: any may match
        ({"key": "aws-node-termination-handler/spot-itn", "operator": "Exists"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
        ({"key": "", "operator": "Equal"}, False),
    ],
)
def test_toleration_matching_follows_kubernetes(toleration: dict[str, Any], tolerated: bool) -> None:
    assert tolerates(toleration, MAINTENANCE) is tolerated


def test_a_blanket_toleration_is_reported_for_every_drain_taint() -> None:
    flavor = res(RESOURCE_FLAVOR)(spec={"tolerations": [{"operator": "Exists"}]})
    found = drain_taints_not_tolerated(flavor, CTX)
    assert len(found) == len(DRAIN_TAINT_KEYS)
    assert any(MAINTENANCE in m and "every admitted pod" in m for m in found)
    assert any("node.kubernetes.io/unschedulable" in m for m in found)  # the cordon itself


def test_drain_taint_keys_are_the_handlers() -> None:
    """The pinned handler's taint keys, copied from aws-node-termination-handler v1.25.6 pkg/node/node.go."""
    assert set(DRAIN_TAINT_KEYS) == {
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "aws-node-termination-handler/rebalance-recommendation",
        "node.kubernetes.io/unschedulable",
    }


def test_policy_team_label_is_the_platforms() -> None:
    from components.charts import kueue

    assert TEAM_LABEL == kueue.TEAM_LABEL


@pytest.mark.parametrize(
    "resources",
    [
        [TEAM_A],  # no policy at all
        [TEAM_A, binding(["Deny"])],  # a binding to a policy that does not exist
        [TEAM_A, VOLUME_POLICY, binding(["Deny"], {"matchLabels": {"dlinfra.io/other": "x"}})],  # selects elsewhere
        [TEAM_A, VOLUME_POLICY, binding(["Deny"], policy="other")],
        # A policy that lets pods through when it cannot be evaluated guards nothing.
        [TEAM_A, res(VAP, "vap")(metadata={"name": "team-volumes"},
                                 spec={**VOLUME_POLICY.inputs["spec"], "failurePolicy": "Ignore"}), binding(["Deny"])],
    ],
)  # fmt: skip
def test_team_namespaces_without_a_denying_volume_policy_are_flagged(resources: list[Resource]) -> None:
    (found,) = team_namespaces_volume_policy(resources, CTX)
    assert found.urn == TEAM_A.urn and "team-a" in found.message


def test_namespaces_that_are_no_teams_need_no_volume_policy() -> None:
    system = res(K8S_NAMESPACE, "ns")(metadata={"name": "kube-system"})
    assert team_namespaces_volume_policy([system], CTX) == []


def test_the_rule_passes_the_declared_stack_and_catches_the_binding_removed() -> None:
    from pathlib import Path

    from dlinfra.checks.plans import Plan
    from tests import reference as ref

    stack = "prod-us-west-2-k8s"
    data = ref.runs()[stack].plan(ref.fleet().project)
    resources = Plan(Path(f"{stack}.json"), stack, data).rule_resources()
    assert team_namespaces_volume_policy(resources, CTX) == []
    without = [r for r in resources if r.type != VAP_BINDING]
    assert len(team_namespaces_volume_policy(without, CTX)) == len(ref.fleet().teams)


def test_a_stack_without_team_namespaces_needs_no_queueing() -> None:
    assert gpu_pods_queued([res(K8S_NAMESPACE)(metadata={"name": "kube-system"})], CTX) == []


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ([TEAM_NAMESPACE, _gate_policy(), _binding("Deny")], "no Kueue release"),
        ([TEAM_NAMESPACE, _kueue_release(KUEUE_CONFIG | {"manageJobsWithoutQueueName": False}), _gate_policy(),
          _binding("Deny")], "manageJobsWithoutQueueName is not true"),
        ([TEAM_NAMESPACE, _kueue_release(KUEUE_CONFIG | {"managedJobsNamespaceSelector": {}}), _gate_policy(),
          _binding("Deny")], "does not require the dlinfra.io/team label"),
        ([TEAM_NAMESPACE, _kueue_release()], "no ValidatingAdmissionPolicy bound with Deny"),
        ([TEAM_NAMESPACE, _kueue_release(), _gate_policy()], "no ValidatingAdmissionPolicy bound with Deny"),
        ([TEAM_NAMESPACE, _kueue_release(), _gate_policy(), _binding("Warn", "Audit")], "bound with Deny"),
        ([TEAM_NAMESPACE, _kueue_release(), _gate_policy(failurePolicy="Ignore"), _binding("Deny")],
         "bound with Deny"),
        ([TEAM_NAMESPACE, _kueue_release(), _gate_policy(variables=[], validations=[{"expression": "true"}]),
          _binding("Deny")], "bound with Deny"),
        ([TEAM_NAMESPACE, _kueue_release(), _gate_policy(matchConstraints={"resourceRules": [
            {"operations": ["CREATE"], "resources": ["pods"]}]}), _binding("Deny")], "bound with Deny"),
        # The job-owner policy: missing, unbound, failing open, blind to a job kind Kueue manages, or checking
        # nobody's identity.
        ([*QUEUED[:4]], "limits who sets a controller ownerReference on batch/jobs, jobset.x-k8s.io/jobsets"),
        ([*QUEUED[:4], _owner_policy()], "limits who sets a controller ownerReference"),
        ([*QUEUED[:4], _owner_policy(failurePolicy="Ignore"), OWNERS[1]],
         "limits who sets a controller ownerReference"),
        ([*QUEUED[:4], _owner_policy((("batch", "jobs"),)), OWNERS[1]],
         "controller ownerReference on jobset.x-k8s.io/jobsets in team namespaces"),
        ([*QUEUED[:4], _owner_policy(validations=[{"expression": "!has(object.metadata.ownerReferences)"}]),
          OWNERS[1]], "limits who sets a controller ownerReference"),
        ([*QUEUED[:4], _owner_policy(matchConstraints={"resourceRules": [{"apiGroups": ["batch"], "operations": [
            "CREATE", "UPDATE"], "resources": ["jobs"]}]}), OWNERS[1]], "limits who sets a controller ownerReference"),
    ],
)  # fmt: skip
def test_each_gap_in_gpu_queueing_is_named(stack: list[Resource], message: str) -> None:
    found = [v.message for v in gpu_pods_queued(stack, CTX)]
    assert any(message in m for m in found), found


def test_the_platforms_kueue_and_admission_policy_pass() -> None:
    """What components/ declares for the reference fleet satisfies the rule, and fails it without the policy."""
    from dlinfra.model.fleet.load import load_fleet
    from tests.components._platform import platform_stacks
    from tests.conftest import REFERENCE_FLEET

    stack = platform_stacks(load_fleet(REFERENCE_FLEET).fleet)["prod-us-west-2"]
    declared = [Resource(urn=r.urn, type=r.type, name=r.name, inputs=r.inputs) for r in stack.resources]
    assert _team_namespaces_in(declared) and gpu_pods_queued(declared, CTX) == []
    without_policy = [r for r in declared if r.type != VAP or r.name != "platform-gpu-admission"]
    assert [v.message for v in gpu_pods_queued(without_policy, CTX)] == [
        "no ValidatingAdmissionPolicy bound with Deny checks pods in team namespaces against Kueue's "
        "kueue.x-k8s.io/admission gate: a GPU pod that escapes Kueue's webhook would start unqueued"
    ]
    # Without the job-owner policy, a GPU Job named the child of an admitted CPU Job would run unqueued.
    without_owners = [r for r in declared if r.type != VAP or r.name != "platform-job-owners"]
    (message,) = [v.message for v in gpu_pods_queued(without_owners, CTX)]
    assert message.startswith("no ValidatingAdmissionPolicy bound with Deny limits who sets a controller "
                              "ownerReference on batch/jobs")  # fmt: skip


def _team_namespaces_in(resources: list[Resource]) -> list[Resource]:
    return [r for r in resources if r.type == K8S_NAMESPACE and TEAM_LABEL in r.inputs["metadata"].get("labels", {})]
