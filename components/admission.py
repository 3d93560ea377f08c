"""The admission policies that keep a team's GPU work inside Kueue, declared as children of the Platform (not a
component of its own): GPU pods only with Kueue's admission, and job ownership set only by trusted controllers
(components/charts/gpu_admission.py holds their CEL and why). Each policy is bound with Deny, fails closed, and
matches team namespaces only (components/charts/kueue.py team_namespace_selector)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.charts import gpu_admission
from components.charts import kueue as kueue_chart

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]


def declare(
    name: str, *, controller_namespaces: Sequence[str], frameworks: Sequence[str], opts: Options, meta: Meta
) -> None:
    """Both policies and their bindings. `controller_namespaces`: whose service accounts are trusted controllers;
    `frameworks`: the job kinds Kueue manages; `opts` and `meta`: the Platform's option and metadata makers."""
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
    ):
        policy = admission.ValidatingAdmissionPolicy(
            f"{name}-{key}", metadata=meta(policy_name), spec=spec, opts=opts()
        )
        admission.ValidatingAdmissionPolicyBinding(
            f"{name}-{key}-binding",
            metadata=meta(policy_name),
            spec=gpu_admission.binding_spec(policy_name),
            opts=opts(depends_on=[policy]),
        )
