"""What the platform's own small pods share (helpers; no component of their own): the stock Python image they run
in, their scripts (components/scripts) shipped in a ConfigMap in their package layout, the short-lived API token,
and a locked-down container run as nobody; for those that patch nodes, their account, rights, limits and network.
The Capacity Block flavor keeper (block_flavors), the GPU burn-in agent (gpu_burn_in) and the GPU repair controller
(gpu_repair) use them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components.charts.gpu_admission import binding_spec
from components.scripts import kube_api

# The Docker official Python image, as ECR Public mirrors it (docker/library/python), one exact release: tag
# 3.13.9-slim-bookworm (docker-library/python 3.13/slim-bookworm/Dockerfile, PYTHON_VERSION 3.13.9). The scripts
# use the standard library only.
IMAGE = "public.ecr.aws/docker/library/python:3.13.9-slim-bookworm"
NOBODY = 65534
SCRIPTS_MOUNT = "/opt/dlinfra"  # the ConfigMap's package tree; PYTHONPATH
API_TOKEN_VOLUME = "api-token"


def script_files(*modules: ModuleType) -> dict[str, str]:
    """ConfigMap data: each script module's source and its packages' empty __init__.py, keyed by dotted file name
    ("components.scripts.kube_api.py"), since a key cannot hold a slash (script_items lays them out)."""
    files: dict[str, str] = {}
    for module in modules:
        parts = module.__name__.split(".")
        for depth in range(1, len(parts)):
            files[".".join(parts[:depth]) + ".__init__.py"] = ""
        files[f"{module.__name__}.py"] = Path(str(module.__file__)).read_text(encoding="utf-8")
    return dict(sorted(files.items()))


def script_items(files: dict[str, str]) -> list[dict[str, str]]:
    """The ConfigMap volume's items: each script file at its package path ("components/scripts/kube_api.py")."""
    return [{"key": key, "path": key.removesuffix(".py").replace(".", "/") + ".py"} for key in files]


def python_container(name: str, module: ModuleType, *args: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A container that runs `python3 -m module args` from the shipped scripts, as nobody, read-only, no privileges;
    `mounts`: its volume mounts besides the scripts' and the API token's."""
    return {
        "name": name,
        "image": IMAGE,
        "command": ["python3", "-m", module.__name__, *args],
        # An exact release tag: cached on the node, it runs while the registry is away.
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "PYTHONPATH", "value": SCRIPTS_MOUNT},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "scripts", "mountPath": SCRIPTS_MOUNT, "readOnly": True},
            {"name": API_TOKEN_VOLUME, "mountPath": kube_api.SERVICE_ACCOUNT, "readOnly": True},
            *mounts,
        ],
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NOBODY,
        "runAsGroup": NOBODY,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_volumes(config_map: str, files: dict[str, str], token_seconds: int, *extra: str) -> list[dict[str, Any]]:
    """The scripts from `config_map` in their layout (plus the `extra` keys at the top), and the API token only
    where it is used, living `token_seconds`, with its CA beside it: the same files the kubelet would mount by
    itself (Kubernetes "Configure Service Accounts for Pods", projected volume)."""
    items = script_items(files) + [{"key": key, "path": key} for key in extra]
    return [
        {"name": "scripts", "configMap": {"name": config_map, "items": items}},
        {
            "name": API_TOKEN_VOLUME,
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": token_seconds}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]
            },
        },
    ]


def beat_probes(script: ModuleType) -> dict[str, dict[str, Any]]:
    """The container's liveness and readiness probes on the heartbeat files `script` touches (its HEARTBEAT_DIR, ALIVE
    after every pass, READY after one that reached the API server): each fails when its file is older than the
    script's LIVE_SECONDS or READY_SECONDS, or missing."""

    def probe(name: str, seconds: int) -> dict[str, Any]:
        path = f"{script.HEARTBEAT_DIR}/{name}"
        check = f"import os, sys, time; sys.exit(time.time() - os.stat({path!r}).st_mtime > {seconds})"
        return {
            "exec": {"command": ["python3", "-c", check]},
            "initialDelaySeconds": script.POLL_SECONDS,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        }

    return {
        "livenessProbe": probe(script.ALIVE, script.LIVE_SECONDS),
        "readinessProbe": probe(script.READY, script.READY_SECONDS),
    }


def node_update_policy(user: str, name: str, validations: list[dict[str, str]]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy spec for one service account's updates of nodes and of their status (a patch is an
    update to admission), failing closed: `name` its match condition's name, `validations` what it must keep."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["nodes", "nodes/status"],
                }
            ]
        },
        "matchConditions": [{"name": name, "expression": f"request.userInfo.username == '{user}'"}],
        "validations": validations,
    }


def api_only_network_policy(labels: dict[str, str]) -> dict[str, Any]:
    """The pods take no connections, and make one kind: HTTPS to the API server (the kubernetes Service's address,
    translated to the control plane's, on 443 for EKS)."""
    return {
        "podSelector": {"matchLabels": labels},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [{"ports": [{"protocol": "TCP", "port": 443}]}],
    }


def declare_held_account(
    name: str,
    key: str,
    *,
    namespace: str,
    role: str,
    rules: list[dict[str, Any]],
    policy: tuple[str, str, dict[str, Any]],
    files: dict[str, str],
    labels: dict[str, str],
    opts: Callable[..., pulumi.ResourceOptions],
    meta: Callable[..., k8s.meta.v1.ObjectMetaArgs],
) -> list[pulumi.Resource]:
    """A script's service account `key`, its ClusterRole `role` of `rules` and the ValidatingAdmissionPolicy that holds
    it tighter (`policy`: the URN suffix, its name and its spec), bound with Deny before the rights are; its scripts'
    ConfigMap and a NetworkPolicy letting its pods reach the API server only. Returns what its workload waits for (the
    binding and the ConfigMap)."""
    rbac, admission = k8s.rbac.v1, k8s.admissionregistration.v1
    suffix, policy_name, policy_spec = policy
    account = k8s.core.v1.ServiceAccount(f"{name}-{key}", metadata=meta(key, namespace), opts=opts())
    cluster_role = rbac.ClusterRole(
        f"{name}-{key}-role",
        metadata=meta(role),
        rules=cast("list[k8s.rbac.v1.PolicyRuleArgsDict]", rules),
        opts=opts(),
    )
    # The limits exist before the rights do.
    held = admission.ValidatingAdmissionPolicy(
        f"{name}-{key}-{suffix}",
        metadata=meta(policy_name),
        spec=cast("k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgsDict", policy_spec),
        opts=opts(),
    )
    policy_binding = admission.ValidatingAdmissionPolicyBinding(
        f"{name}-{key}-{suffix}-binding",
        metadata=meta(policy_name),
        spec=binding_spec(policy_name),
        opts=opts(depends_on=[held]),
    )
    binding = rbac.ClusterRoleBinding(
        f"{name}-{key}-binding",
        metadata=meta(role),
        role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
        subjects=[rbac.SubjectArgs(kind="ServiceAccount", name=key, namespace=namespace)],
        opts=opts(depends_on=[cluster_role, account, policy_binding]),
    )
    config = k8s.core.v1.ConfigMap(f"{name}-{key}-scripts", metadata=meta(key, namespace), data=files, opts=opts())
    k8s.networking.v1.NetworkPolicy(
        f"{name}-{key}-network",
        metadata=meta(key, namespace),
        spec=cast("k8s.networking.v1.NetworkPolicySpecArgsDict", api_only_network_policy(labels)),
        opts=opts(),
    )
    return [binding, config]
