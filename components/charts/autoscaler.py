"""cluster-autoscaler: its image per Kubernetes version, values and flags, priority expander table, IAM policy, and
the ProvisioningRequest API it serves to Kueue (flag and CRD)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import yaml

from components.charts.nodes import CLOUD_NODE_AFFINITY
from components.charts.pinned import ADDONS_FILE, load_addons
from dlinfra.errors import DlinfraError
from dlinfra.model import gpu_health
from dlinfra.model.fleet.pools import MAX_CHECKPOINT_GRACE

AUTOSCALER_TAG = "k8s.io/cluster-autoscaler"
PRIORITY_CONFIGMAP = "cluster-autoscaler-priority-expander"  # the name cluster-autoscaler watches
AUTOSCALER_SA = "cluster-autoscaler"
# A hash of the GPU pools' node labels on the autoscaler's pods: a label change rolls them (autoscaler_values).
NODE_LABELS_ANNOTATION = "dlinfra.io/gpu-node-labels-sha256"
# Autoscaler priorities (higher wins): capacity we pay for anyway first, spot last.
CLASS_PRIORITY: Mapping[str, int] = {"reserved": 30, "on-demand": 20, "spot": 10}

# How long the autoscaler waits for a node it asked for to register before it gives the node up (and backs the group
# off): large GPU instances take long to boot, load drivers and start Fabric Manager. Kueue's waitForPodsReady
# timeout is derived from it (components/charts/kueue.py), so a job is never evicted while its nodes may still come.
MAX_NODE_PROVISION_SECONDS = 25 * 60

# ProvisioningRequests (autoscaling.x-k8s.io/v1): Kueue's provisioning admission check asks the autoscaler for a
# job's nodes all together before it admits the job. "best-effort-atomic": the autoscaler scales up only if one
# node group can take every pod of the request, and asks for all its nodes in one call (cluster-autoscaler FAQ,
# "How can I use ProvisioningRequest to run batch workloads?"; provisioningrequest/besteffortatomic/
# provisioning_class.go at the pinned tags cluster-autoscaler-1.31.5 .. 1.36.1). On AWS that call is not atomic:
# AwsNodeGroup.AtomicIncreaseSize returns cloudprovider.ErrNotImplemented (cloudprovider/aws/aws_cloud_provider.go
# at every pinned tag) and core/scaleup/orchestrator/executor.go increaseSize then falls back to IncreaseSize, so
# EC2 may deliver part of it; Kueue's waitForPodsReady eviction gives the part back (kueue.py says how).
PROVISIONING_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVREQ_GROUP = "autoscaling.x-k8s.io"
PROVREQ_CRD = f"provisioningrequests.{PROVREQ_GROUP}"
# The autoscaler talks protobuf to the API server by default (--kube-api-content-type), which a CRD does not serve;
# from 1.33 its ProvisioningRequest client switches itself to JSON (main.go / builder/clients.go: "Use a static JSON
# content type config for ProvisioningRequest CRD data exchange"), before that the FAQ's step 3 asks for the flag.
_PROVREQ_JSON_FROM_MINOR = 33


def autoscaler_image_tag(kubernetes_version: str) -> str:
    """The cluster-autoscaler image whose minor version matches the cluster's."""
    tags = load_addons()["cluster-autoscaler"].image_tags
    if kubernetes_version not in tags:
        raise DlinfraError(
            f"no cluster-autoscaler image pinned for Kubernetes {kubernetes_version} (pinned: {', '.join(tags)})",
            file=ADDONS_FILE,
            key="cluster-autoscaler.image_tags",
        )
    return tags[kubernetes_version]


def autoscaler_discovery_tags(cluster_name: pulumi.Input[str]) -> list[pulumi.Input[str]]:
    """ASG tags auto-discovery requires: the ones NodePool puts on every pool of the cluster."""
    return [f"{AUTOSCALER_TAG}/enabled", pulumi.Output.concat(AUTOSCALER_TAG, "/", cluster_name)]


def autoscaler_args(kubernetes_version: str) -> dict[str, str]:
    """cluster-autoscaler flags: priority expander, scale-down that never evicts running GPU work, and
    ProvisioningRequests (for the autoscaler of Kubernetes `kubernetes_version`, "1.33")."""
    args = {
        # Priorities first (reserved > on-demand > spot), then the least idle capacity among equals.
        "expander": "priority,least-waste",
        "balance-similar-node-groups": "true",
        # Training pods use emptyDir scratch; that must not pin an idle node forever.
        "skip-nodes-with-local-storage": "false",
        # CPU nodes: consolidate below half use.
        "scale-down-utilization-threshold": "0.5",
        # GPU nodes: only when no GPU is requested at all, so consolidation never evicts a running GPU job: a node
        # is a candidate only at or below the threshold (v1.33.6 core/scaledown/eligibility isNodeAtOrBelow-
        # UtilizationThreshold, GPU requests / allocatable), checked before any pod, so no annotation lets it take
        # a GPU job's node; the job "allows" it only by ending. Must stay below 1 / the most GPUs an instance type
        # has (8 in dlinfra/data/instance_types.yaml: 0.125): rule `drain-outlasts-checkpoint-grace`. Applies to
        # nodes labelled k8s.amazonaws.com/accelerator (components/nodepool.py node_labels). Shared GPU nodes have no
        # such label; their groups set a CPU and memory threshold of their own, so a node with any notebook on it
        # stays (gpu_sharing.SCALE_DOWN_THRESHOLD_TAG, rule `shared-gpu-pools-advertise-shares`).
        "scale-down-gpu-utilization-threshold": "0.1",
        # A pod on a node it does remove (CPU pools) is evicted with min(its grace, this) (drain.go evictPod):
        # the largest checkpoint_grace the fleet allows, so no pod's grace is cut (default 600 s, FAQ).
        "max-graceful-termination-sec": str(MAX_CHECKPOINT_GRACE),
        "scale-down-unneeded-time": "10m",
        "scale-down-delay-after-add": "10m",
        "max-node-provision-time": f"{MAX_NODE_PROVISION_SECONDS // 60}m",
        # The GPU DaemonSets (device plugin, DCGM) must not make an idle GPU node look used.
        "ignore-daemonsets-utilization": "true",
        "cordon-node-before-terminating": "true",
        # Serve Kueue's ProvisioningRequests (flag "enable-provisioning-requests", default false: config/flags/
        # flags.go, main.go before 1.33). The chart's ClusterRole already grants provisioningrequests and their
        # status, and podtemplates (templates/clusterrole.yaml, chart 9.59.0); the CRD is ours
        # (provisioning_request_crd).
        "enable-provisioning-requests": "true",
        # A new GPU node registers with the burn-in taint and sheds it once its GPUs pass (dlinfra.model.gpu_health).
        # As a startup taint the autoscaler counts the node as coming up rather than as a node pending pods cannot
        # use, and leaves it out of node templates, so it neither scales up again for the same pods nor gives up on
        # the pool (FAQ "How does Cluster Autoscaler treat nodes with status/startup/ignore taints?", v1.33.6). A node
        # still tainted after 15 minutes counts as unready (clusterstate.go MaxNodeStartupTime), which the burn-in's
        # time limit stays under (gpu_health.BURN_IN_SECONDS).
        "startup-taint": gpu_health.BURN_IN_TAINT[0],
        # Status taints: the node counts as ready, and the taint stays out of the pool's scale-up template. The
        # unhealthy taint, or a template built from a failed node would say no pod fits the pool and the autoscaler,
        # caching it (node-info-cache-expire-time, 10 years), would never scale the pool up again; the site
        # machines' burn-in taint, so a rebooted site's machines never count as unready (SanitizeTaints, taints.go).
        # The chart repeats a flag for keys that differ after an underscore (templates/deployment.yaml, 9.59.0).
        "status-taint_unhealthy": gpu_health.UNHEALTHY_TAINT[0],
        "status-taint_site": gpu_health.SITE_BURN_IN_TAINT[0],
    }
    if int(kubernetes_version.split(".")[1]) < _PROVREQ_JSON_FROM_MINOR:
        args["kube-api-content-type"] = "application/json"
    return args


def autoscaler_values(
    cluster_name: pulumi.Input[str],
    region: str,
    kubernetes_version: str,
    *,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """cluster-autoscaler: AWS auto-discovery by this cluster's tags, credentials from Pod Identity, the image of
    the cluster's Kubernetes minor version. `node_labels`: the GPU model labels of each pool's nodes; a change restarts
    the autoscaler, which otherwise keeps scaling a pool at zero on the template it cached from the pool's last node
    (--node-info-cache-expire-time, 10 years by default: cluster-autoscaler 1.33 config/flags/flags.go), without the
    new labels."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name, "tags": autoscaler_discovery_tags(cluster_name)},
        "image": {"tag": autoscaler_image_tag(kubernetes_version)},
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SA}},
        "extraArgs": autoscaler_args(kubernetes_version),
        "affinity": CLOUD_NODE_AFFINITY,
        # Scale-down must not evict the autoscaler itself mid-decision.
        "podAnnotations": {
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
            NODE_LABELS_ANNOTATION: node_labels_digest(node_labels or {}),
        },
    }


def node_labels_digest(node_labels: Mapping[str, Mapping[str, str]]) -> str:
    """The autoscaler pods' NODE_LABELS_ANNOTATION: changes with any pool's GPU model labels."""
    return hashlib.sha256(json.dumps(node_labels, sort_keys=True).encode()).hexdigest()


def _regex_literal(name: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", name)


def render_priorities(groups: Mapping[str, Sequence[str]]) -> str:
    """The priority expander's configuration: capacity class -> ASG names, as priority -> anchored regexes."""
    unknown = set(groups) - set(CLASS_PRIORITY)
    if unknown:
        raise ValueError(f"unknown capacity class {sorted(unknown)}; known: {', '.join(CLASS_PRIORITY)}")
    table = {
        CLASS_PRIORITY[cls]: [f"^{_regex_literal(name)}$" for name in sorted(names)]
        for cls, names in sorted(groups.items(), key=lambda kv: -CLASS_PRIORITY[kv[0]])
        if names
    }
    return yaml.safe_dump(table, sort_keys=False)


def autoscaler_policy(cluster_name: pulumi.Input[str]) -> dict[str, Any]:
    """Read-only discovery everywhere; resizing only Auto Scaling groups tagged for this cluster."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Discover",
                "Effect": "Allow",
                # Describe calls support no resource-level permissions.
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                "Sid": "ScaleOwnGroups",
                "Effect": "Allow",
                "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                "Resource": "*",
                "Condition": {
                    "StringEquals": {
                        pulumi.Output.concat("aws:ResourceTag/", AUTOSCALER_TAG, "/", cluster_name): "owned",
                        f"aws:ResourceTag/{AUTOSCALER_TAG}/enabled": "true",
                    }
                },
            },
        ],
    }


def _provreq_schema() -> dict[str, Any]:
    """The ProvisioningRequest's structural schema, written from the Go types of apis/provisioningrequest/
    autoscaling.x-k8s.io/v1/types.go (cluster-autoscaler-1.33.6): what the API server validates and prunes by.
    The x-kubernetes-* extensions are spelt x_kubernetes_*, as pulumi-kubernetes' JSONSchemaPropsArgs names them; its
    provider sends them with hyphens (provider/pkg/provider/provider.go, the x_kubernetes_* to x-kubernetes-* table)."""
    dns_name = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    name = {"type": "string", "maxLength": 253, "pattern": dns_name}
    immutable = [{"rule": "self == oldSelf", "message": "Value is immutable"}]
    condition = {
        "type": "object",
        "required": ["lastTransitionTime", "message", "reason", "status", "type"],
        "properties": {
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "message": {"type": "string", "maxLength": 32768},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "reason": {"type": "string", "minLength": 1, "maxLength": 1024},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "type": {"type": "string", "maxLength": 316},
        },
    }
    spec = {
        "type": "object",
        "required": ["podSets", "provisioningClassName"],
        "properties": {
            "podSets": {
                "type": "array",
                "minItems": 1,
                "maxItems": 32,
                "x_kubernetes_validations": immutable,
                "items": {
                    "type": "object",
                    "required": ["count", "podTemplateRef"],
                    "properties": {
                        "count": {"type": "integer", "format": "int32", "minimum": 1},
                        "podTemplateRef": {"type": "object", "required": ["name"], "properties": {"name": name}},
                    },
                },
            },
            "provisioningClassName": {**name, "x_kubernetes_validations": immutable},
            "parameters": {
                "type": "object",
                "maxProperties": 100,
                "additionalProperties": {"type": "string", "maxLength": 255},
                "x_kubernetes_validations": immutable,
            },
        },
    }
    status = {
        "type": "object",
        "properties": {
            "conditions": {
                "type": "array",
                "items": condition,
                "x_kubernetes_list_type": "map",
                "x_kubernetes_list_map_keys": ["type"],
            },
            "provisioningClassDetails": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": {"type": "string", "maxLength": 32768},
            },
        },
    }
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def provisioning_request_crd() -> dict[str, Any]:
    """The ProvisioningRequest CRD's spec. Neither chart installs it (cluster-autoscaler chart 9.59.0 has no crds/
    and no CRD template; the FAQ's step 5 says to deploy it), and Kueue enables its provisioning controller only if
    the API server serves it when Kueue starts (cmd/kueue/main.go: ServerSupportsProvisioningRequest, v0.19.2), so
    it is declared before both releases. Version v1 only: the one the autoscaler's client (provreqclient, 1.31.5 and
    later) and Kueue (pkg/controller/admissionchecks/provisioning, v0.19.2) use; v1beta1 is served by the upstream CRD
    but stored by nothing of ours."""
    return {
        "group": PROVREQ_GROUP,
        "names": {
            "kind": "ProvisioningRequest",
            "listKind": "ProvisioningRequestList",
            "plural": "provisioningrequests",
            "singular": "provisioningrequest",
            "shortNames": ["provreq", "provreqs"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": _provreq_schema()},
                "subresources": {"status": {}},
            }
        ],
    }
