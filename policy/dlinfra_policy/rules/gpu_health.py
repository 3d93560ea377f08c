"""Rules for the GPU burn-in: GPU nodes register with the burn-in taint, and every cluster has what takes it off
(docs/gpu-health.md; dlinfra.model.gpu_health holds the names)."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import re
from collections.abc import Mapping, Sequence

from dlinfra.model import gpu_health
from dlinfra.model.fleet.labels import GPU_MODEL_LABEL, GPU_PRODUCT_LABEL, label_value_problem

from .compute import AUTOSCALER, AUTOSCALING_GROUP, LAUNCH_TEMPLATE, _is_gpu_group
from .core import VAP, Context, Resource, Violation, as_object, as_objects, deny_bound_policies, tags_of
from .platform import RESOURCE_FLAVOR, _kueue_config
from .provisioning import _release_named, _seconds

DAEMON_SET = "kubernetes:apps/v1:DaemonSet"
AGENT = "gpu-burn-in"  # components/gpu_burn_in.py NAME
OWN_NODE_POLICY = "dlinfra-gpu-burn-in-own-node"  # components/gpu_burn_in.py OWN_NODE_POLICY


def _enforced(resources: Sequence[Resource], policy: str) -> bool:
    """The ValidatingAdmissionPolicy `policy` is declared and bound with Deny."""
    declared = {as_object(r.inputs.get("metadata")).get("name") for r in resources if r.type == VAP}
    return policy in declared and policy in deny_bound_policies(resources)


def _user_data(template: Resource) -> str | None:
    """The launch template's user data, decoded; None while unknown (a real preview) or not base64."""
    value = template.inputs.get("userData")
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return None


def _tolerates(tolerations: Sequence[object], key: str) -> bool:
    return any(
        isinstance(t, dict)
        and t.get("operator") == "Exists"
        and (t.get("key") in (None, "", key))
        and t.get("effect") in (None, "", "NoSchedule")
        for t in tolerations
    )


def _flag_values(args: Mapping[str, object]) -> dict[str, set[str]]:
    """The chart's extraArgs by flag: a key repeats a flag when it differs after an underscore ("status-taint_a")
    (cluster-autoscaler chart templates/deployment.yaml, mustRegexFind "^[^_]+")."""
    flags: dict[str, set[str]] = {}
    for key, value in args.items():
        flags.setdefault(str(key).split("_", 1)[0], set()).add(str(value))
    return flags


def gpu_nodes_burn_in(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU nodes take work only after their GPUs pass the check.

    - Cloud GPU pools: the launch template's user data registers the node with the burn-in taint and writes the
      check's expectation; the Auto Scaling group's scale-from-zero template does not carry the taint (the
      autoscaler would then think no pending pod fits the pool and never scale it up: cluster-autoscaler FAQ, "How
      can I scale a node group to 0?", node-template taint tags).
    - Every cluster: the autoscaler knows the taint as a startup taint (FAQ, "startup taints"), the burn-in agent runs
      on GPU nodes through it, its own-node admission policy is bound with Deny (a kubelet cannot remove its own
      taints, NodeRestriction, so the agent's rights must be held to its node), and Kueue's waitForPodsReady outlasts
      the autoscaler's max-node-provision-time plus the burn-in.
    """
    out: list[Violation] = []
    burn_in_key = gpu_health.BURN_IN_TAINT[0]
    taint = "{}={}:{}".format(*gpu_health.BURN_IN_TAINT)
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        if not _is_gpu_group(group, templates, ctx):
            continue
        if f"{AUTOSCALER}/node-template/taint/{burn_in_key}" in tags_of(group):
            out.append(
                Violation(
                    group.urn,
                    f"the scale-from-zero template carries the burn-in taint {burn_in_key}: no pod tolerates it, "
                    "so the autoscaler never scales the pool up; it is a startup taint, not the pool's",
                )
            )
        for template in (t for t in templates if t.urn in group.dependencies):
            text = _user_data(template)
            if text is None:
                continue
            if taint not in text or "--register-with-taints" not in text:
                out.append(
                    Violation(
                        template.urn,
                        f"GPU nodes must register with the burn-in taint {taint} (user data --register-with-taints): "
                        "without it they take work before their GPUs are checked",
                    )
                )
            if gpu_health.EXPECT_PATH not in text or gpu_health.CHECK_UNIT not in text:
                out.append(
                    Violation(
                        template.urn,
                        f"the user data neither writes {gpu_health.EXPECT_PATH} nor starts {gpu_health.CHECK_UNIT}: "
                        "the check never runs, and the node stays tainted",
                    )
                )
    autoscaler = _release_named(resources, "cluster-autoscaler")
    if autoscaler is None:
        return out  # not an in-cluster stack
    args = as_object(as_object(autoscaler.inputs.get("values")).get("extraArgs"))
    flags = _flag_values(args)
    if burn_in_key not in flags.get("startup-taint", set()):
        out.append(
            Violation(
                autoscaler.urn,
                f"cluster-autoscaler: {burn_in_key} is not a startup taint: a node under burn-in would look ready to "
                "it, so it would scale up again for the same pods",
            )
        )
    for key, why in (
        (gpu_health.UNHEALTHY_TAINT[0], "a failed node's taint would enter its pool's scale-up template, and the "
         "autoscaler would never scale the pool up again"),
        (gpu_health.SITE_BURN_IN_TAINT[0], "rebooted site machines would count as unready and stop the autoscaler"),
    ):  # fmt: skip
        if key not in flags.get("status-taint", set()):
            out.append(Violation(autoscaler.urn, f"cluster-autoscaler: {key} is not a status taint: {why}"))
    agents = [r for r in resources if r.type == DAEMON_SET and as_object(r.inputs.get("metadata")).get("name") == AGENT]
    pod = as_object(as_object(as_object(agents[0].inputs.get("spec")).get("template")).get("spec")) if agents else {}
    if not agents or not _tolerates(list(as_objects(pod.get("tolerations"))), burn_in_key):
        out.append(
            Violation(
                agents[0].urn if agents else autoscaler.urn,
                f"no DaemonSet {AGENT} tolerating {burn_in_key}: nothing takes the burn-in taint off, so no GPU node "
                "ever takes work",
            )
        )
    if not _enforced(resources, OWN_NODE_POLICY):
        out.append(
            Violation(
                autoscaler.urn,
                f"the ValidatingAdmissionPolicy {OWN_NODE_POLICY} is missing or not bound with Deny: the burn-in "
                "agent's right to patch nodes would reach every node and every field",
            )
        )
    kueue = _release_named(resources, "kueue")
    config = _kueue_config(kueue) if kueue is not None else "no Kueue release"
    wait = as_object(as_object(config).get("waitForPodsReady")) if not isinstance(config, str) else {}
    timeout = _seconds(wait.get("timeout"))
    provision = _seconds(args.get("max-node-provision-time", "15m"))
    if kueue is not None and wait and (timeout is None or provision is None or
                                       timeout < provision + gpu_health.BURN_IN_SECONDS):  # fmt: skip
        out.append(
            Violation(
                kueue.urn,
                f"Kueue waitForPodsReady.timeout {wait.get('timeout')!r} is shorter than the autoscaler's "
                f"max-node-provision-time plus the GPU burn-in ({gpu_health.BURN_IN_SECONDS} s): jobs would be "
                "evicted while their nodes are still being checked",
            )
        )
    return out


GPU_LABEL_KEYS = (GPU_MODEL_LABEL, GPU_PRODUCT_LABEL)


def _registered_labels(user_data: str) -> dict[str, str] | None:
    """The labels of the user data's kubelet --node-labels, or None where it has none."""
    match = re.search(r"--node-labels[= ](?:'([^']*)'|(\S+))", user_data)
    if match is None:
        return None
    return dict(pair.split("=", 1) for pair in (match.group(1) or match.group(2)).split(",") if "=" in pair)


def gpu_node_model_labels(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU nodes carry both model labels, valid, the same at registration as in the autoscaler's scale-from-zero
    template; Kueue's flavors select dlinfra's own.

    - The kubelet refuses to start with an invalid --node-labels value (Kubernetes "Labels and Selectors": 63
      characters at most, alphanumerics, '-', '_', '.'), so the node never joins.
    - The autoscaler builds a pool's scale-from-zero template from the group's node-template label tags; where they
      differ from the labels nodes register with, it scales up for pods the new node cannot take, or not at all
      (cluster-autoscaler FAQ, "How can I scale a node group to 0?").
    - A GPU flavor selects dlinfra.io/gpu-model, and nvidia.com/gpu.product only with NVIDIA's product name. Its node
      labels go into each admitted job's pods, which keep them for life (Kueue "Resource Flavor"): a flavor that
      selected the short name there would strand its jobs when the environment moves to NVIDIA's names
      (gpu_product_label).
    """
    out: list[Violation] = []
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        if not _is_gpu_group(group, templates, ctx):
            continue
        tags = tags_of(group)
        for template in (t for t in templates if t.urn in group.dependencies):
            text = _user_data(template)
            labels = _registered_labels(text) if text is not None else None
            if labels is None:
                continue
            for key in GPU_LABEL_KEYS:
                value = labels.get(key)
                if value is None:
                    out.append(Violation(template.urn, f"GPU nodes register without the label {key}"))
                    continue
                problem = label_value_problem(value)
                if problem:
                    out.append(Violation(template.urn, f"{key}: {problem}; the kubelet would not start"))
                tagged = tags.get(f"{AUTOSCALER}/node-template/label/{key}")
                if tagged != value:
                    out.append(
                        Violation(
                            group.urn,
                            f"the scale-from-zero template's {key} is {tagged!r}, the nodes register with {value!r}: "
                            "the autoscaler would scale the pool for pods its nodes cannot take, or not at all",
                        )
                    )
    for flavor in (r for r in resources if r.type == RESOURCE_FLAVOR):
        selected = as_object(as_object(flavor.inputs.get("spec")).get("nodeLabels"))
        if GPU_PRODUCT_LABEL not in selected and GPU_MODEL_LABEL not in selected:
            continue  # not a GPU flavor
        if GPU_MODEL_LABEL not in selected:
            out.append(Violation(flavor.urn, f"the GPU flavor does not select {GPU_MODEL_LABEL}"))
        elif selected.get(GPU_PRODUCT_LABEL) == selected[GPU_MODEL_LABEL]:
            out.append(
                Violation(
                    flavor.urn,
                    f"the flavor selects {GPU_PRODUCT_LABEL} by the short name {selected[GPU_MODEL_LABEL]!r}: its "
                    "admitted jobs' pods keep that for life, and are stranded when the nodes carry NVIDIA's name",
                )
            )
    return out


DEPLOYMENT = "kubernetes:apps/v1:Deployment"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
REPAIR_CONTROLLER = "gpu-repair"  # components/gpu_repair.py NAME
REPAIR_POLICY = "dlinfra-gpu-repair-annotation-only"  # components/gpu_repair.py ANNOTATION_ONLY_POLICY
SET_INSTANCE_HEALTH = "autoscaling:SetInstanceHealth"


def gpu_nodes_repaired(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A GPU node put off work is repaired, a share of its pool at a time, and nothing else can be done with it.

    - Every cluster: one repair controller (a Deployment of one replica, replaced by Recreate: two deciding at once
      would approve past a pool's share), held to its annotation by its policy bound with Deny; the burn-in agent
      reaches the host's repair directory (dlinfra.model.gpu_health.REPAIR_DIR), where it writes what was approved.
    - Every GPU node role that may mark instances unhealthy (autoscaling:SetInstanceHealth, which the repair's host
      unit calls) does so in named groups only: with "*" a node could have every group's instances replaced.
    """
    out: list[Violation] = []
    for policy in (r for r in resources if r.type == ROLE_POLICY):
        document = policy.inputs.get("policy")
        if not isinstance(document, str):
            continue
        for statement in as_objects(_json_object(document).get("Statement")):
            actions = statement.get("Action")
            listed = [str(a) for a in (actions if isinstance(actions, list) else [actions])]
            # IAM matches actions case-insensitively, with * and ? wildcards ("IAM JSON policy elements: Action").
            if statement.get("Effect") == "Allow" and any(
                fnmatch.fnmatchcase(SET_INSTANCE_HEALTH.lower(), a.lower()) for a in listed
            ):
                targets = statement.get("Resource")
                for target in targets if isinstance(targets, list) else [targets]:
                    if (
                        not str(target).startswith("arn:")
                        or "autoScalingGroupName/" not in str(target)
                        or str(target).endswith("/*")
                    ):
                        out.append(
                            Violation(
                                policy.urn,
                                f"{SET_INSTANCE_HEALTH} on {target!r}: a node may mark instances unhealthy only in "
                                "its own pool's group, by name",
                            )
                        )
    autoscaler = _release_named(resources, "cluster-autoscaler")
    if autoscaler is None:
        return out  # not an in-cluster stack
    controllers = [
        r
        for r in resources
        if r.type == DEPLOYMENT and as_object(r.inputs.get("metadata")).get("name") == REPAIR_CONTROLLER
    ]
    if not controllers:
        out.append(
            Violation(autoscaler.urn, f"no Deployment {REPAIR_CONTROLLER}: a GPU node put off work is never repaired")
        )
    for controller in controllers:
        spec = as_object(controller.inputs.get("spec"))
        if spec.get("replicas") != 1 or as_object(spec.get("strategy")).get("type") != "Recreate":
            out.append(
                Violation(
                    controller.urn,
                    f"{REPAIR_CONTROLLER} must run as one replica replaced by Recreate: two controllers would each "
                    "approve up to a pool's share",
                )
            )
    if not _enforced(resources, REPAIR_POLICY):
        out.append(
            Violation(
                autoscaler.urn,
                f"the ValidatingAdmissionPolicy {REPAIR_POLICY} is missing or not bound with Deny: the repair "
                "controller's right to patch nodes would reach every field of every node",
            )
        )
    agents = [r for r in resources if r.type == DAEMON_SET and as_object(r.inputs.get("metadata")).get("name") == AGENT]
    for agent in agents:
        pod = as_object(as_object(as_object(agent.inputs.get("spec")).get("template")).get("spec"))
        paths = {as_object(v.get("hostPath")).get("path") for v in as_objects(pod.get("volumes"))}
        if gpu_health.REPAIR_DIR not in paths:
            out.append(
                Violation(
                    agent.urn,
                    f"the burn-in agent does not mount {gpu_health.REPAIR_DIR}: an approved repair never reaches the "
                    "machine",
                )
            )
    return out


def _json_object(text: str) -> Mapping[str, object]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, Mapping) else {}
