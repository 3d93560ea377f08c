"""EKS versions and the managed add-on versions pinned for each (dlinfra/data/eks.yaml). Pure: no pulumi."""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Literal

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


def unsupported_zone_ids(region: str) -> frozenset[str]:
    """Zone ids of a region where EKS cannot place a cluster's subnets."""
    zones: Mapping[str, list[str]] = _data()["unsupported_zone_ids"]  # type: ignore[assignment]
    return frozenset(zones.get(region, ()))


UpgradePolicy = Literal["standard", "extended"]
WARN_DAYS = 90  # a quarter ahead: time to test add-ons on the next version and schedule the upgrade
TODAY_VARIABLE = "DLINFRA_TODAY"  # YYYY-MM-DD: the date lifecycle checks use (tests pin it)


def today() -> datetime.date:
    """The date lifecycle checks use: DLINFRA_TODAY when set (tests pin it), else the calendar's."""
    pinned = os.environ.get(TODAY_VARIABLE)
    return datetime.date.fromisoformat(pinned) if pinned else datetime.date.today()


@dataclass(frozen=True)
class Lifecycle:
    """Where a cluster version stands in its support under an upgrade policy, on a given day."""

    level: Literal["ok", "warning", "error"]
    message: str


def support_end(version: str, policy: UpgradePolicy) -> datetime.date:
    """The last day of the support the policy pays for; KeyError for a version without dates."""
    dates: Mapping[str, Mapping[str, datetime.date]] = _data()["support"]  # type: ignore[assignment]
    return dates[version]["standard_end" if policy == "standard" else "extended_end"]


def lifecycle(version: str, policy: UpgradePolicy, on: datetime.date) -> Lifecycle:
    """ok, a warning within WARN_DAYS of the end of the policy's support, or an error past it.

    Past the end, EKS has upgraded (or is about to upgrade) the cluster by itself, so declaring the old version
    would make the next apply try to downgrade it.
    """
    try:
        end = support_end(version, policy)
    except KeyError:
        return Lifecycle("error", f"Kubernetes {version} has no support dates in dlinfra/data/eks.yaml")
    newer = [v for v in supported_versions() if _minor(v) > _minor(version) and support_end(v, policy) > on]
    advice = f"move to {newer[0]}" if newer else "pin add-ons for a newer version in dlinfra/data/eks.yaml"
    if on > end:
        return Lifecycle(
            "error",
            f"Kubernetes {version} left {policy} support on {end.isoformat()}: EKS upgrades the cluster itself, "
            f"and this fleet would try to downgrade it; {advice} (or upgrade_policy: extended, if it still covers it)",
        )
    if (end - on).days <= WARN_DAYS:
        return Lifecycle(
            "warning",
            f"Kubernetes {version} leaves {policy} support on {end.isoformat()} ({(end - on).days} days); {advice}",
        )
    return Lifecycle("ok", f"Kubernetes {version} has {policy} support until {end.isoformat()}")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)
