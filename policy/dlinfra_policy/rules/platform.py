"""Rules for Kubernetes objects of the platform: team namespaces (Pod Security, the volume policy), Kueue wiring,
tolerations of drain taints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from dlinfra.model.fleet.labels import DRAIN_TAINT_KEYS

from .core import VAP, VAP_BINDING, Context, Resource, Violation, as_list, as_object, as_objects, deny_bound_policies

K8S_NAMESPACE = "kubernetes:core/v1:Namespace"
RESOURCE_FLAVOR = "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"
# Where each workload kind keeps its pods' tolerations. DaemonSets are left out on purpose: they run on every node
# and drains skip them (their controller tolerates the cordon itself).
POD_SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
TEAM_LABEL = "dlinfra.io/team"  # components/charts/kueue.py TEAM_LABEL: a team's namespace
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
KUEUE_CUSTOM = "kubernetes:kueue.x-k8s.io/v1beta2:"  # Kueue kinds as typed resources: <this><Kind>
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # components/charts/multikueue.py
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
KUEUE_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod webhook adds until admission
# The integrations that queue what a team may run on GPUs besides job kinds: bare Pods, Deployments, StatefulSets.
QUEUED_FRAMEWORKS = ("batch/job", "pod", "deployment", "statefulset")
# Kueue integrations that queue pods, not a job object: their pods are gated, and the pod policy checks the gate.
POD_FRAMEWORKS = ("pod", "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")


def team_namespaces_pod_security(resource: Resource, ctx: Context) -> list[str]:
    """Team namespaces enforce the baseline or restricted Pod Security Standard, never privileged.

    Source: Kubernetes "Pod Security Admission" (the pod-security.kubernetes.io/enforce label; unset means
    privileged) and "Pod Security Standards" (baseline forbids privileged containers, host namespaces, hostPath
    and added capabilities). Training pods that use EFA need none of those (tests/fixtures/k8s/efa-training-pod.yaml).
    """
    if resource.type != K8S_NAMESPACE:
        return []
    labels = as_object(as_object(resource.inputs.get("metadata")).get("labels"))
    if TEAM_LABEL not in [str(k) for k in labels]:
        return []
    level = labels.get(PSA_ENFORCE)
    if level in ("baseline", "restricted"):
        return []
    state = "unset, which admits privileged pods" if level is None else f"{level!r}"
    return [f'{PSA_ENFORCE} is {state}: team namespaces enforce "baseline" (or "restricted")']


def _kueue_named(resources: Sequence[Resource], kind: str) -> dict[str, Resource]:
    return {
        str(as_object(r.inputs.get("metadata")).get("name")): r for r in resources if r.type == f"{KUEUE_CUSTOM}{kind}"
    }


def multikueue_wired(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """MultiKueue objects are wired so Kueue activates them.

    - A ClusterQueue may not limit a MultiKueue AdmissionCheck to some flavors: Kueue marks such a queue inactive
      ("Cannot specify MultiKueue AdmissionCheck per flavor", kueue v0.19 pkg/cache/scheduler/clusterqueue.go).
    - A MultiKueue AdmissionCheck names a MultiKueueConfig of the stack, whose clusters are MultiKueueClusters of
      the stack (Kueue docs, "Setup a MultiKueue environment": otherwise the check stays inactive).
    - A worker's kubeconfig comes from a Secret: `locationType: Path` needs an alpha feature gate and a file
      mounted into the controller (same guide, "Enable locationType=Path").
    """
    checks = _kueue_named(resources, "AdmissionCheck")
    configs = _kueue_named(resources, "MultiKueueConfig")
    clusters = _kueue_named(resources, "MultiKueueCluster")
    multikueue = {
        n for n, r in checks.items() if as_object(r.inputs.get("spec")).get("controllerName") == MULTIKUEUE_CONTROLLER
    }
    out = []
    for name, queue in _kueue_named(resources, "ClusterQueue").items():
        strategy = as_object(as_object(queue.inputs.get("spec")).get("admissionChecksStrategy"))
        for rule in as_objects(strategy.get("admissionChecks")):
            if str(rule.get("name")) in multikueue and as_list(rule.get("onFlavors")):
                out.append(
                    Violation(
                        queue.urn,
                        f"ClusterQueue {name}: MultiKueue check {rule.get('name')} is limited to "
                        "some flavors; Kueue deactivates the queue (it must apply to every flavor)",
                    )
                )
    for name in sorted(multikueue):
        params = as_object(as_object(checks[name].inputs.get("spec")).get("parameters"))
        config = configs.get(str(params.get("name")))
        if params.get("kind") != "MultiKueueConfig" or config is None:
            out.append(
                Violation(checks[name].urn, f"AdmissionCheck {name}: no MultiKueueConfig {params.get('name')!r}")
            )
            continue
        missing = [
            str(c) for c in as_list(as_object(config.inputs.get("spec")).get("clusters")) if str(c) not in clusters
        ]
        if missing:
            out.append(
                Violation(
                    config.urn, f"MultiKueueConfig {params.get('name')}: no MultiKueueCluster {', '.join(missing)}"
                )
            )
    for name, cluster in clusters.items():
        source = as_object(as_object(as_object(cluster.inputs.get("spec")).get("clusterSource")).get("kubeConfig"))
        if source.get("locationType", "Secret") != "Secret":
            out.append(
                Violation(
                    cluster.urn, f"MultiKueueCluster {name}: kubeconfig from {source.get('locationType')}, not a Secret"
                )
            )
    return out


def tolerates(toleration: Mapping[str, Any], key: str, effect: str = "NoSchedule") -> bool:
    """Does this toleration let a pod onto a node with taint `key` (any value) and `effect`?

    Source: Kubernetes "Taints and Tolerations": an empty key with operator Exists matches every taint, an empty
    effect every effect; operator Equal (the default) also needs the value, which the handler's taints vary.
    """
    if toleration.get("effect") not in (None, "", effect):
        return False
    if toleration.get("key") in (None, ""):
        return toleration.get("operator") == "Exists"
    return bool(toleration.get("key") == key)


def _drain_taints_tolerated(tolerations: Any) -> list[str]:
    return sorted({key for t in as_objects(tolerations) for key in DRAIN_TAINT_KEYS if tolerates(t, key)})


def drain_taints_not_tolerated(resource: Resource, ctx: Context) -> list[str]:
    """Work never tolerates the taints that keep it off a node about to go (maintenance, interruption, cordon).

    Sources: aws-node-termination-handler v1.25.6 pkg/node/node.go (the taints it puts before draining);
    Kueue v1beta2 ResourceFlavor: `tolerations` "will be added to the pods admitted" in the flavor, and
    workloads "must have tolerations for these nodeTaints" to be admitted to it (apis/kueue/v1beta2).
    """
    if resource.type == RESOURCE_FLAVOR:
        spec = as_object(resource.inputs.get("spec"))
        out = [
            f"spec.tolerations tolerate {key}: Kueue adds them to every admitted pod, which would then start on "
            "nodes about to go into maintenance or be drained"
            for key in _drain_taints_tolerated(spec.get("tolerations"))
        ]
        out += [
            f"spec.nodeTaints lists {t.get('key')}: every job admitted to this flavor would have to tolerate it"
            for t in as_objects(spec.get("nodeTaints"))
            if t.get("key") in DRAIN_TAINT_KEYS
        ]
        return out
    path = POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return []
    pod_spec: Mapping[str, Any] = resource.inputs
    for part in path:
        pod_spec = as_object(pod_spec.get(part))
    return [
        f"the pod template tolerates {key}: its pods would start on nodes about to go into maintenance or be drained"
        for key in _drain_taints_tolerated(pod_spec.get("tolerations"))
    ]


def _selects(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A label selector (matchLabels, matchExpressions) against labels; an absent or empty one selects all."""
    selector = as_object(selector)
    if any(labels.get(k) != v for k, v in as_object(selector.get("matchLabels")).items()):
        return False
    for e in as_objects(selector.get("matchExpressions")):
        key, values = str(e.get("key")), [str(v) for v in as_list(e.get("values"))]
        present = key in [str(k) for k in labels]
        value = str(labels.get(key)) if present else None
        ok = {
            "In": present and value in values,
            "NotIn": not present or value not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(e.get("operator")), False)
        if not ok:
            return False
    return True


def _guards_pod_volumes(policy: Resource) -> bool:
    """The policy matches pod creation, fails closed, and validates the pod's volumes."""
    spec = as_object(policy.inputs.get("spec"))
    if spec.get("failurePolicy") == "Ignore":
        return False
    rules = as_objects(as_object(spec.get("matchConstraints")).get("resourceRules"))
    pods = any(
        {"pods", "*"} & {str(r) for r in as_list(rule.get("resources"))}
        and {"CREATE", "*"} & {str(o) for o in as_list(rule.get("operations"))}
        and {"", "*"} & {str(g) for g in as_list(rule.get("apiGroups"))}
        for rule in rules
    )
    return pods and any("volumes" in str(v.get("expression")) for v in as_objects(spec.get("validations")))


def team_namespaces_volume_policy(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every team namespace is covered by a denying ValidatingAdmissionPolicy over pods' volumes.

    Pod Security `baseline`, which team namespaces enforce, does not restrict volume types (Kubernetes "Pod Security
    Standards": only `restricted` limits them), so without such a policy a team's pod may mount an inline `nfs`
    volume, which kubelet mounts anonymously and around every EFS access point; EFS's file system policy then is the
    only guard (EFS user guide, "Default EFS file system policy"). A policy acts only through a binding whose
    validationActions include Deny and whose namespaceSelector selects the namespace, and it must fail closed
    (Kubernetes "Validating Admission Policy": failurePolicy, validationActions, matchResources). That the CEL rule
    refuses nfs and hostPath is tested with a CEL evaluator (tests/components/test_team_volumes.py).
    """
    namespaces = [
        r
        for r in resources
        if r.type == K8S_NAMESPACE
        and TEAM_LABEL in [str(k) for k in as_object(as_object(r.inputs.get("metadata")).get("labels"))]
    ]
    if not namespaces:
        return []
    policies = {
        str(as_object(r.inputs.get("metadata")).get("name")): r
        for r in resources
        if r.type == VAP and _guards_pod_volumes(r)
    }
    selectors = []
    for binding in (r for r in resources if r.type == VAP_BINDING):
        spec = as_object(binding.inputs.get("spec"))
        policy = policies.get(str(spec.get("policyName")))
        if policy is None or "Deny" not in [str(a) for a in as_list(spec.get("validationActions"))]:
            continue
        constraints = as_object(as_object(policy.inputs.get("spec")).get("matchConstraints"))
        selectors.append(
            (as_object(spec.get("matchResources")).get("namespaceSelector"), constraints.get("namespaceSelector"))
        )
    out = []
    for namespace in namespaces:
        metadata = as_object(namespace.inputs.get("metadata"))
        labels = {**as_object(metadata.get("labels")), "kubernetes.io/metadata.name": metadata.get("name")}
        if not any(_selects(b, labels) and _selects(p, labels) for b, p in selectors):
            out.append(
                Violation(
                    namespace.urn,
                    f"team namespace {metadata.get('name')}: no ValidatingAdmissionPolicy denies pods' inline volumes "
                    "here (baseline admits nfs and other network volumes, which bypass EFS access points): bind one "
                    "with validationActions [Deny] whose namespaceSelector selects it",
                )
            )
    return out


def _team_namespaces(resources: Sequence[Resource]) -> list[Resource]:
    return [
        r
        for r in resources
        if r.type == K8S_NAMESPACE
        and TEAM_LABEL in [str(k) for k in as_object(as_object(r.inputs.get("metadata")).get("labels"))]
    ]


def _selects_teams_only(selector: Mapping[str, Any]) -> bool:
    """Does a label selector require the team label (and so pick team namespaces and nothing else)?"""
    labels = [str(k) for k in as_object(selector.get("matchLabels"))]
    required = [
        e.get("key") for e in as_objects(selector.get("matchExpressions")) if e.get("operator") in ("Exists", "In")
    ]
    return TEAM_LABEL in labels or TEAM_LABEL in required


def _kueue_config(release: Resource) -> Mapping[str, Any] | str:
    """A Kueue release's controller configuration, or what is wrong with it."""
    config_yaml = as_object(as_object(release.inputs.get("values")).get("managerConfig")).get(
        "controllerManagerConfigYaml"
    )
    if not isinstance(config_yaml, str):
        return "no managerConfig.controllerManagerConfigYaml: Kueue's own defaults queue batch Jobs only"
    try:
        return as_object(yaml.safe_load(config_yaml))
    except yaml.YAMLError as exc:
        return f"managerConfig.controllerManagerConfigYaml is not YAML: {exc}"


def _frameworks(config: Mapping[str, Any]) -> list[str]:
    return [str(f) for f in as_list(as_object(config.get("integrations")).get("frameworks"))]


def _kueue_config_problems(release: Resource) -> list[str]:
    config = _kueue_config(release)
    if isinstance(config, str):
        return [config]
    out = []
    frameworks = _frameworks(config)
    missing = [f for f in QUEUED_FRAMEWORKS if f not in frameworks]
    if missing:
        out.append(
            f"integrations.frameworks lacks {', '.join(missing)}: the list replaces Kueue's defaults, so such "
            "workloads in a team namespace start without a queue or a quota"
        )
    if config.get("manageJobsWithoutQueueName") is not True:
        out.append("manageJobsWithoutQueueName is not true: a workload without a queue name is not queued")
    if not _selects_teams_only(as_object(config.get("managedJobsNamespaceSelector"))):
        out.append(
            f"managedJobsNamespaceSelector does not require the {TEAM_LABEL} label: Kueue would manage other "
            "namespaces' pods (system ones included) or none"
        )
    return out


def _guards_gpu_pods(policy: Mapping[str, Any]) -> bool:
    """Does a ValidatingAdmissionPolicy check pod creation in team namespaces against Kueue's gate, failing closed?"""
    spec = as_object(policy.get("spec"))
    constraints = as_object(spec.get("matchConstraints"))
    pods = any(
        "pods" in as_list(rule.get("resources"))
        and any(op in ("CREATE", "*") for op in as_list(rule.get("operations")))
        for rule in as_objects(constraints.get("resourceRules"))
    )
    expressions = [str(e.get("expression")) for key in ("variables", "validations") for e in as_objects(spec.get(key))]
    return (
        pods
        and _selects_teams_only(as_object(constraints.get("namespaceSelector")))
        and spec.get("failurePolicy", "Fail") == "Fail"
        and bool(as_objects(spec.get("validations")))
        and any(KUEUE_GATE in e for e in expressions)
    )


def _job_owner_guard(policy: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The (API group, resource) pairs whose creates and updates a ValidatingAdmissionPolicy checks for who sets
    ownerReferences, in team namespaces and failing closed; empty when it is no such policy."""
    spec = as_object(policy.get("spec"))
    constraints = as_object(spec.get("matchConstraints"))
    expressions = [str(e.get("expression")) for key in ("variables", "validations") for e in as_objects(spec.get(key))]
    if not (
        _selects_teams_only(as_object(constraints.get("namespaceSelector")))
        and spec.get("failurePolicy", "Fail") == "Fail"
        and as_objects(spec.get("validations"))
        and any("ownerReferences" in e for e in expressions)
        and any("request.userInfo.username" in e for e in expressions)
    ):
        return set()
    out = set()
    for rule in as_objects(constraints.get("resourceRules")):
        operations = {str(op) for op in as_list(rule.get("operations"))}
        if "*" in operations or {"CREATE", "UPDATE"} <= operations:
            out |= {(str(g), str(r)) for g in as_list(rule.get("apiGroups")) for r in as_list(rule.get("resources"))}
    return out


def _job_resources(releases: Sequence[Resource]) -> set[tuple[str, str]]:
    """(API group, resource) of batch Jobs and of every job kind the Kueue releases manage ("<group>/<kind>", whose
    resource is the kind's plural: "jobset.x-k8s.io/jobset" -> jobsets)."""
    out = {("batch", "jobs")}
    for release in releases:
        config = _kueue_config(release)
        if isinstance(config, str):
            continue
        for framework in _frameworks(config):
            if framework not in POD_FRAMEWORKS and "/" in framework:
                group, kind = framework.rsplit("/", 1)
                out.add((group, f"{kind}s"))
    return out


def gpu_pods_queued(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every GPU workload in a team namespace goes through Kueue, and what tries not to is refused.

    - Kueue's configuration queues bare Pods, Deployments and StatefulSets as well as Jobs, in the team namespaces
      and only there: integrations.frameworks replaces Kueue's defaults, manageJobsWithoutQueueName queues what
      names no queue, managedJobsNamespaceSelector scopes both (Kueue v0.19.2 apis/config/v1beta2
      configuration_types.go; Kueue docs "Run Plain Pods" and "Setup manageJobsWithoutQueueName").
    - A bound ValidatingAdmissionPolicy, failing closed, checks pods in team namespaces against Kueue's scheduling
      gate, so a pod that escapes the webhook is refused (Kubernetes docs "Validating Admission Policy"; Kueue
      docs "Setup a Job Admission Policy"). A ResourceQuota cannot stand in: it counts admitted pods too.
    - A second such policy lets only trusted controllers give a job of a kind Kueue manages a controller
      ownerReference: Kueue leaves a job unsuspended when an ancestor it manages owns it (v0.19.2
      pkg/controller/jobframework/utils.go WorkloadShouldBeSuspended, FindAncestorJobManagedByKueue), and the job
      controller's pods of such a job pass the pod policy. It must cover batch Jobs and every job kind in Kueue's
      integrations.frameworks.
    """
    teams = _team_namespaces(resources)
    if not teams:
        return []
    anchor = teams[0].urn
    out = []
    releases = [r for r in resources if r.type == HELM_RELEASE and "kueue" in str(r.inputs.get("chart", ""))]
    if not releases:
        out.append(Violation(anchor, "team namespaces but no Kueue release: nothing queues their GPU workloads"))
    for release in releases:
        out += [Violation(release.urn, f"Kueue: {m}") for m in _kueue_config_problems(release)]
    guards = {
        str(as_object(r.inputs.get("metadata")).get("name"))
        for r in resources
        if r.type == VAP and _guards_gpu_pods(r.inputs)
    }
    bound = deny_bound_policies(resources)
    if not guards & bound:
        out.append(
            Violation(
                anchor,
                "no ValidatingAdmissionPolicy bound with Deny checks pods in team namespaces against Kueue's "
                f"{KUEUE_GATE} gate: a GPU pod that escapes Kueue's webhook would start unqueued",
            )
        )
    owners_guarded: set[tuple[str, str]] = set()
    for r in resources:
        if r.type == VAP and str(as_object(r.inputs.get("metadata")).get("name")) in bound:
            owners_guarded |= _job_owner_guard(r.inputs)
    unguarded = sorted(_job_resources(releases) - owners_guarded)
    if unguarded:
        out.append(
            Violation(
                anchor,
                "no ValidatingAdmissionPolicy bound with Deny limits who sets a controller ownerReference on "
                f"{', '.join(f'{g}/{r}' for g, r in unguarded)} in team namespaces: Kueue leaves a job whose owner "
                "it manages unsuspended, so a GPU job named the child of an admitted job would run unqueued",
            )
        )
    return out


LOCAL_QUEUE = "default"  # components/charts/kueue.py LOCAL_QUEUE: where Kueue sends what names no queue


def team_namespaces_have_local_queue(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every team namespace has the LocalQueue `default`, feeding a ClusterQueue of the same stack.

    Kueue manages every pod and job of a team namespace (manageJobsWithoutQueueName, with the pod integration:
    Kueue v0.19.2 pkg/controller/jobs/pod/pod_webhook.go gates each pod), and sends what names no queue to the
    namespace's LocalQueue `default` (Kueue docs "Setup default LocalQueue"). Without it, or without the ClusterQueue
    it names, their workloads are never admitted, so every pod there, CPU-only ones included, waits forever: a region
    without GPU capacity still needs its teams' queues.
    """
    cluster_queues = set(_kueue_named(resources, "ClusterQueue"))
    local_queues: dict[str, str] = {}
    for r in resources:
        if r.type != f"{KUEUE_CUSTOM}LocalQueue":
            continue
        metadata = as_object(r.inputs.get("metadata"))
        if metadata.get("name") == LOCAL_QUEUE:
            local_queues[str(metadata.get("namespace"))] = str(as_object(r.inputs.get("spec")).get("clusterQueue"))
    out = []
    for namespace in _team_namespaces(resources):
        name = str(as_object(namespace.inputs.get("metadata")).get("name"))
        if name not in local_queues:
            out.append(
                Violation(
                    namespace.urn,
                    f"team namespace {name}: no LocalQueue {LOCAL_QUEUE!r}, so Kueue admits none of its pods and jobs "
                    "(even CPU-only ones wait behind its gate forever); declare one, feeding the team's ClusterQueue",
                )
            )
        elif local_queues[name] not in cluster_queues:
            out.append(
                Violation(
                    namespace.urn,
                    f"team namespace {name}: its LocalQueue {LOCAL_QUEUE!r} feeds ClusterQueue "
                    f"{local_queues[name]!r}, which this stack does not declare: nothing there is admitted",
                )
            )
    return out
