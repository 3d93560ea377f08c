"""The admission policies that keep a team's GPU work inside Kueue and its grace within its pool's, declared as
children of the Platform (not a component of its own): GPU pods only with Kueue's admission, job ownership set only
by trusted controllers (components/charts/gpu_admission.py holds their CEL and why), and terminationGracePeriodSeconds
at most the pool's checkpoint_grace (components/charts/checkpoint_grace.py). Each policy is bound with Deny, fails
closed, and matches team namespaces only (components/charts/kueue.py team_namespace_selector)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.charts import checkpoint_grace, gpu_admission
from components.charts import kueue as kueue_chart
from dlinfra.model.fleet.pools import CHECKPOINT_GRACE_ANNOTATION

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]


def declare(
    name: str,
    *,
    controller_namespaces: Sequence[str],
    frameworks: Sequence[str],
    opts: Options,
    meta: Meta,
    grace_caps: Mapping[str, int] | None = None,
    gpu_pools: Sequence[str] = (),
) -> None:
    """The policies and their bindings. `controller_namespaces`: whose service accounts are trusted controllers;
    `frameworks`: the job kinds Kueue manages; `opts` and `meta`: the Platform's option and metadata makers;
    `grace_caps`: pool -> checkpoint_grace of every pool of the region (None: no grace policy); `gpu_pools`: the
    GPU ones."""
    selector = kueue_chart.team_namespace_selector()
    admission = k8s.admissionregistration.v1
    for key, policy_name, spec in (
        (
            "gpu-admission",
            gpu_admission.POLICY_NAME,
            gpu_admission.policy_spec(selector, controller_namespaces, frameworks),
        ),
        (
            "job-owners",
            gpu_admission.JOB_OWNERS_POLICY_NAME,
            gpu_admission.job_owner_policy_spec(selector, controller_namespaces, frameworks),
        ),
        (
            "job-tolerations",
            gpu_admission.JOB_TOLERATIONS_POLICY_NAME,
            gpu_admission.job_tolerations_policy_spec(selector),
        ),
        *(
            [
                (
                    "checkpoint-grace",
                    checkpoint_grace.POLICY_NAME,
                    checkpoint_grace.policy_spec(selector, grace_caps, gpu_pools),
                ),
                (
                    "checkpoint-grace-jobs",
                    checkpoint_grace.JOBS_POLICY_NAME,
                    checkpoint_grace.policy_spec(selector, grace_caps, gpu_pools, jobs=True),
                ),
            ]
            if grace_caps is not None
            else []
        ),
    ):
        # The grace policy says what it caps, for rule `drain-outlasts-checkpoint-grace`.
        marks = {CHECKPOINT_GRACE_ANNOTATION: json.dumps(dict(sorted((grace_caps or {}).items())))}
        policy = admission.ValidatingAdmissionPolicy(
            f"{name}-{key}",
            metadata=meta(policy_name, annotations=marks if key == "checkpoint-grace" else None),
            spec=spec,
            opts=opts(),
        )
        admission.ValidatingAdmissionPolicyBinding(
            f"{name}-{key}-binding",
            metadata=meta(policy_name),
            spec=gpu_admission.binding_spec(policy_name),
            opts=opts(depends_on=[policy]),
        )
