"""Every region's Platform, from the shared offline run of the reference fleet, indexed for the platform and chart
tests: the AWS side from the regional stack, the Kubernetes objects from its in-cluster stack."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.charts import kueue as kueue_chart
from components.charts import multikueue
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names
from dlinfra.offline import plan_export
from tests import reference
from tests.conftest import REFERENCE_FLEET

KUEUE_SCHEMA = Path(__file__).parent.parent / "fixtures" / "k8s" / "kueue.x-k8s.io-v1beta2.json"
CILIUM_SCHEMA = Path(__file__).parent.parent / "fixtures" / "k8s" / "cilium.io.json"
RELEASE = "kubernetes:helm.sh/v3:Release"
FS_ID, AP_ID = "fs-0123456789abcdef0", "fsap-0123456789abcdef0"


class Stack:
    """One region's platform records, indexed for the tests: the AWS side from the regional stack, the
    Kubernetes objects from its in-cluster stack."""

    def __init__(self, regional: plan_export.StackResult, in_cluster: plan_export.StackResult) -> None:
        self.role = regional.role
        self.outputs = regional.outputs
        self.resources = regional.resources + in_cluster.resources
        self.by_name = {r.name: r for r in self.resources if r.type != "pulumi:pulumi:StackReference"}

    def of_type(self, type_token: str) -> list[plan_export.ResourceRecord]:
        return [r for r in self.resources if r.type == type_token]

    def release(self, addon: str) -> dict[str, Any]:
        return self.by_name[f"platform-{addon}"].inputs

    def kueue(self, kind: str) -> dict[str, dict[str, Any]]:
        return {
            r.inputs["metadata"]["name"] + "/" + r.inputs["metadata"].get("namespace", ""): r.inputs
            for r in self.of_type(f"kubernetes:{kueue_chart.KUEUE_API}:{kind}")
        }

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every team's own ClusterQueue (in the cohort), by team; overflow queues are not teams'."""
        overflow = {multikueue.overflow_check_name(t) for t in self.kueue_teams()}
        return {
            key.split("/")[0]: value
            for key, value in self.kueue("ClusterQueue").items()
            if not {c["name"] for c in value["spec"].get("admissionChecksStrategy", {}).get("admissionChecks", [])}
            & overflow
        }

    def kueue_teams(self) -> list[str]:
        """Teams with a namespace on this cluster (their label names them)."""
        return [
            r.inputs["metadata"]["labels"][kueue_chart.TEAM_LABEL]
            for r in self.of_type("kubernetes:core/v1:Namespace")
            if kueue_chart.TEAM_LABEL in r.inputs["metadata"].get("labels", {})
        ]


def platform_stacks(fleet: Fleet) -> dict[str, Stack]:
    """Every region's platform, by regional stack name."""
    runs = reference.runs()
    return {
        role.name: Stack(runs[role.name], runs[f"{role.name}-k8s"])
        for role in stackroles.roles(fleet)
        if role.kind == "regional"
    }


def regional_stacks() -> list[str]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    return [r.name for r in stackroles.roles(fleet) if r.kind == "regional"]


def stack_names(stack: Stack) -> Names:
    return Names("dlinfra", stack.role.environment, stack.role.region)


def asg_name(stack: Stack, pool: str) -> str:
    return stack_names(stack).physical("pool", pool, max_len=255)


def nominal_gpus(queue_or_cohort: Mapping[str, Any], per_gpu: Mapping[str, int] | None = None) -> dict[str, int]:
    """Flavor -> nominal GPUs of a ClusterQueue or Cohort manifest: a shared flavor's first share over `per_gpu`, how
    many of it one GPU offers (kueue.Flavor.resources)."""
    return {
        f["name"]: int(f["resources"][0]["nominalQuota"]) // (per_gpu or {}).get(f["name"], 1)
        for group in queue_or_cohort["spec"]["resourceGroups"]
        for f in group["flavors"]
    }
