"""EKS versions and the managed add-on versions pinned for each (dlinfra/data/eks.yaml). Pure: no pulumi."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

from ruamel.yaml import YAML

ADDONS = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-efs-csi-driver")


@functools.cache
def _data() -> Mapping[str, object]:
    data: Mapping[str, object] = YAML(typ="safe").load(resources.files("dlinfra").joinpath("data/eks.yaml").read_text())
    return data


def offered_versions() -> tuple[str, ...]:
    """Kubernetes versions EKS offers."""
    return tuple(str(v) for v in _data()["offered"])  # type: ignore[attr-defined]


def supported_versions() -> tuple[str, ...]:
    """Versions dlinfra has pinned add-on versions for."""
    return tuple(sorted(_data()["addons"]))  # type: ignore[call-overload]


def addon_versions(version: str) -> dict[str, str]:
    """Pinned managed add-on versions for a Kubernetes version; KeyError when there are none."""
    pins: Mapping[str, Mapping[str, str]] = _data()["addons"]  # type: ignore[assignment]
    return dict(pins[version])


def version_problem(version: str) -> str | None:
    """Why a Kubernetes version cannot be used, or None when it can."""
    if version not in offered_versions():
        return f"EKS does not offer Kubernetes {version}; it offers {', '.join(offered_versions())}"
    if version not in supported_versions():
        return (
            f"dlinfra has no pinned add-on versions for Kubernetes {version} "
            f"(it has {', '.join(supported_versions())}); add them to dlinfra/data/eks.yaml"
        )
    return None
