"""cluster-autoscaler: its image per Kubernetes version, values and flags, priority expander table and IAM policy."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import yaml

from components.charts.nodes import CLOUD_NODE_AFFINITY
from components.charts.pinned import ADDONS_FILE, load_addons
from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.pools import MAX_CHECKPOINT_GRACE

AUTOSCALER_TAG = "k8s.io/cluster-autoscaler"
PRIORITY_CONFIGMAP = "cluster-autoscaler-priority-expander"  # the name cluster-autoscaler watches
AUTOSCALER_SA = "cluster-autoscaler"
# Autoscaler priorities (higher wins): capacity we pay for anyway first, spot last.
CLASS_PRIORITY: Mapping[str, int] = {"reserved": 30, "on-demand": 20, "spot": 10}


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


def autoscaler_args() -> dict[str, str]:
    """cluster-autoscaler flags: priority expander, and scale-down that never evicts running GPU work."""
    return {
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
        # nodes labelled k8s.amazonaws.com/accelerator (components/nodepool.py node_labels).
        "scale-down-gpu-utilization-threshold": "0.1",
        # A pod on a node it does remove (CPU pools) is evicted with min(its grace, this) (drain.go evictPod):
        # the largest checkpoint_grace the fleet allows, so no pod's grace is cut (default 600 s, FAQ).
        "max-graceful-termination-sec": str(MAX_CHECKPOINT_GRACE),
        "scale-down-unneeded-time": "10m",
        "scale-down-delay-after-add": "10m",
        # Large GPU instances take long to boot, load drivers and start Fabric Manager.
        "max-node-provision-time": "25m",
        # The GPU DaemonSets (device plugin, DCGM) must not make an idle GPU node look used.
        "ignore-daemonsets-utilization": "true",
        "cordon-node-before-terminating": "true",
    }


def autoscaler_values(cluster_name: pulumi.Input[str], region: str, image_tag: str) -> dict[str, Any]:
    """cluster-autoscaler: AWS auto-discovery by this cluster's tags, credentials from Pod Identity."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name, "tags": autoscaler_discovery_tags(cluster_name)},
        "image": {"tag": image_tag},
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SA}},
        "extraArgs": autoscaler_args(),
        "affinity": CLOUD_NODE_AFFINITY,
        # Scale-down must not evict the autoscaler itself mid-decision.
        "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    }


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
