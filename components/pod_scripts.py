"""What the platform's own small pods share (helpers; no component of their own): the stock Python image they run
in, their scripts (components/scripts) shipped in a ConfigMap in their package layout, the short-lived API token,
and a locked-down container run as nobody. The Capacity Block flavor keeper (block_flavors) and the GPU burn-in
agent (gpu_burn_in) use them."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

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
