"""Rules for capacity that arrives whole: Kueue's provisioning check in front of autoscaled GPU pools, the autoscaler
serving it, and waitForPodsReady bounding what a job that got part of its nodes holds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .core import Context, Resource, Violation, as_list, as_object, as_objects
from .platform import HELM_RELEASE, KUEUE_CUSTOM, _kueue_config, _kueue_named

# The names below restate components/charts/kueue.py and autoscaler.py.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"  # Kueue v0.19.2 ProvisioningRequestControllerName
ATOMIC_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"  # the autoscaler's atomic scale-up class
PROVREQ_CRD = "provisioningrequests.autoscaling.x-k8s.io"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
POOL_LABEL = "dlinfra.io/pool"  # components/charts/nodes.py POOL_LABEL: every node's pool, a site's machines too
SITE_LABEL = "dlinfra.io/site"  # dlinfra/render/nodeadm.py SITE_LABEL: a site's machines only
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def _seconds(duration: Any) -> float | None:
    """A Go duration of hours, minutes and seconds ("30m", "1h30m"), in seconds; None when it is not one."""
    text = str(duration)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(v + u for v, u in parts) != text:
        return None
    return sum(float(v) * {"h": 3600, "m": 60, "s": 1}[u] for v, u in parts)


def _release_named(resources: Sequence[Resource], chart: str) -> Resource | None:
    return next(
        (r for r in resources if r.type == HELM_RELEASE and str(r.inputs.get("chart", "")).endswith(chart)), None
    )


def _provisioning_checks(resources: Sequence[Resource]) -> set[str]:
    """AdmissionChecks of the provisioning controller whose ProvisioningRequestConfig (of this stack) asks for the
    autoscaler's atomic scale-up."""
    configs = _kueue_named(resources, "ProvisioningRequestConfig")
    out = set()
    for name, check in _kueue_named(resources, "AdmissionCheck").items():
        spec = as_object(check.inputs.get("spec"))
        params = as_object(spec.get("parameters"))
        config = configs.get(str(params.get("name")))
        if (
            spec.get("controllerName") == PROVISIONING_CONTROLLER
            and params.get("kind") == "ProvisioningRequestConfig"
            and config is not None
            and as_object(config.inputs.get("spec")).get("provisioningClassName") == ATOMIC_CLASS
        ):
            out.add(name)
    return out


def gpu_queues_provision_whole(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A job on an autoscaled GPU pool is admitted only when its nodes can be had together, and gives back what it
    got when they cannot.

    - Every ClusterQueue flavor whose nodes the cluster-autoscaler adds (a ResourceFlavor selecting dlinfra.io/pool
      and not dlinfra.io/site)
      carries an AdmissionCheck of Kueue's provisioning controller whose ProvisioningRequestConfig asks for the
      best-effort-atomic-scale-up class (Kueue v0.19.2 docs "ProvisioningRequest"; apis/kueue/v1beta2
      AdmissionCheckStrategyRule.onFlavors: empty means every flavor). Without it Kueue admits on quota alone and the
      autoscaler adds the job's nodes a group at a time (Kueue issues 5133 and 5220).
    - The autoscaler serves ProvisioningRequests (--enable-provisioning-requests, default false: cluster-autoscaler
      config/flags/flags.go) and the stack declares their CRD, which neither chart installs (cluster-autoscaler FAQ,
      "Enabling ProvisioningRequest Support", step 5); Kueue enables its controller only if the CRD is served when
      it starts (v0.19.2 cmd/kueue/main.go).
    - Kueue's waitForPodsReady timeout exceeds the autoscaler's max-node-provision-time: the AWS provider does not
      scale atomically (AwsNodeGroup.AtomicIncreaseSize returns ErrNotImplemented, cloudprovider/aws), so the eviction
      of a job whose pods are not all ready is what returns a partial set of nodes; shorter, it would evict jobs whose
      nodes are still coming; unset, a partial job holds its nodes forever.
    """
    pool_flavors = {
        name
        for name, flavor in _kueue_named(resources, "ResourceFlavor").items()
        if POOL_LABEL in (labels := as_object(as_object(flavor.inputs.get("spec")).get("nodeLabels")))
        and SITE_LABEL not in labels
    }
    checks = _provisioning_checks(resources)
    out: list[Violation] = []
    queued = False
    for name, queue in _kueue_named(resources, "ClusterQueue").items():
        spec = as_object(queue.inputs.get("spec"))
        used = {
            str(f.get("name"))
            for group in as_objects(spec.get("resourceGroups"))
            for f in as_objects(group.get("flavors"))
            if str(f.get("name")) in pool_flavors
        }
        if not used:
            continue
        queued = True
        covered: set[str] = set()
        for rule in as_objects(as_object(spec.get("admissionChecksStrategy")).get("admissionChecks")):
            if str(rule.get("name")) in checks:
                on = {str(f) for f in as_list(rule.get("onFlavors"))}
                covered |= on or used
        missing = sorted(used - covered)
        if missing:
            out.append(
                Violation(
                    queue.urn,
                    f"ClusterQueue {name}: flavors {', '.join(missing)} are autoscaled GPU pools without the "
                    f"provisioning check ({PROVISIONING_CONTROLLER}, class {ATOMIC_CLASS}): Kueue admits a job on "
                    "quota alone and its nodes arrive piecemeal, some of its pods holding GPUs while others pend",
                )
            )
    if not queued:
        return out
    anchor = next(r.urn for r in resources if r.type.startswith(KUEUE_CUSTOM))
    autoscaler = _release_named(resources, "cluster-autoscaler")
    kueue = _release_named(resources, "kueue")
    args = as_object(as_object(autoscaler.inputs.get("values")).get("extraArgs")) if autoscaler else {}
    if autoscaler is None or str(args.get("enable-provisioning-requests")).lower() != "true":
        out.append(
            Violation(
                autoscaler.urn if autoscaler else anchor,
                "cluster-autoscaler: enable-provisioning-requests is not true, so nothing answers Kueue's "
                "ProvisioningRequests and GPU jobs are never admitted",
            )
        )
    if not any(
        r.type == CRD_TYPE and as_object(r.inputs.get("metadata")).get("name") == PROVREQ_CRD for r in resources
    ):
        out.append(
            Violation(anchor, f"no CustomResourceDefinition {PROVREQ_CRD}: neither chart installs it, and Kueue "
                      "skips its provisioning controller when it is missing at start")
        )  # fmt: skip
    config = _kueue_config(kueue) if kueue is not None else "no Kueue release"
    wait = as_object(as_object(config).get("waitForPodsReady")) if not isinstance(config, str) else {}
    timeout, provision = _seconds(wait.get("timeout")), _seconds(args.get("max-node-provision-time", "15m"))
    if timeout is None or provision is None or timeout <= provision:
        out.append(
            Violation(
                kueue.urn if kueue is not None else anchor,
                f"Kueue waitForPodsReady.timeout {wait.get('timeout')!r} must exceed the autoscaler's "
                f"max-node-provision-time {args.get('max-node-provision-time', '15m')!r}: a job on nodes that came "
                "only in part must be evicted whole, and not before its nodes could still come",
            )
        )
    return out
