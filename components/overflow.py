"""MultiKueue in the in-cluster stack, declared as children of the Platform: on the manager, a worker cluster per
region and per overflowing team its check, ClusterQueue and `overflow` LocalQueue; on a worker, the manager's
service account, its least roles and its token. The specs are components/charts/multikueue.py; which teams overflow
where is dlinfra/model/kueue.py's OverflowPlan."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.charts import kueue as kueue_chart
from components.charts import multikueue
from dlinfra.model import kueue

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]
Custom = Callable[..., k8s.apiextensions.CustomResource]  # Platform._custom: a Kueue object by key, kind, name, spec


def declare_manager(
    name: str,
    plan: kueue.OverflowPlan,
    *,
    release: k8s.helm.v3.Release,
    namespaces: Mapping[str, k8s.core.v1.Namespace],
    team_namespaces: Mapping[str, str],
    kubeconfigs: Mapping[str, pulumi.Input[str]],
    custom: Custom,
    opts: Options,
    meta: Meta,
) -> None:
    """The manager's side: a worker cluster per region, and per overflowing team a MultiKueueConfig, its
    AdmissionCheck, a ClusterQueue holding the team's GPUs in those regions, and the `overflow` LocalQueue."""
    flavor = custom("flavor-multikueue", "ResourceFlavor", kueue.OVERFLOW_FLAVOR, {}, [release])
    clusters = {}
    for region in plan.workers:
        secret = k8s.core.v1.Secret(
            f"{name}-multikueue-{region}",
            metadata=meta(multikueue.multikueue_secret_name(region), multikueue.MULTIKUEUE_NAMESPACE),
            type="Opaque",
            string_data={multikueue.KUBECONFIG_KEY: pulumi.Output.secret(kubeconfigs[region])},
            opts=opts(depends_on=[release]),
        )
        clusters[region] = custom(
            f"multikueue-cluster-{region}",
            "MultiKueueCluster",
            multikueue.multikueue_cluster_name(region),
            multikueue.multikueue_cluster_spec(region),
            [secret],
        )
    for team, overflow in plan.teams.items():
        namespace = team_namespaces[team]
        check_name = multikueue.overflow_check_name(team)
        config = custom(
            f"multikueue-config-{team}",
            "MultiKueueConfig",
            check_name,
            multikueue.multikueue_config_spec(overflow.regions),
            [clusters[r] for r in overflow.regions],
        )
        check = custom(
            f"overflow-check-{team}",
            "AdmissionCheck",
            check_name,
            multikueue.overflow_admission_check_spec(team),
            [config],
        )
        queue_name = multikueue.overflow_cluster_queue_name(team)
        queue = custom(
            f"overflow-queue-{team}",
            "ClusterQueue",
            queue_name,
            multikueue.overflow_cluster_queue_spec(team, namespace, overflow.gpus),
            [check, flavor],
        )
        custom(
            f"overflow-local-queue-{team}",
            "LocalQueue",
            kueue.OVERFLOW_QUEUE,
            multikueue.overflow_local_queue_spec(queue_name),
            [queue, namespaces[team]],
            namespace=namespace,
        )


def declare_worker(
    name: str,
    plan: kueue.OverflowPlan,
    region: str,
    *,
    release: k8s.helm.v3.Release,
    namespaces: Mapping[str, k8s.core.v1.Namespace],
    team_namespaces: Mapping[str, str],
    queues: Mapping[str, k8s.apiextensions.CustomResource],
    frameworks: Sequence[str],
    custom: Custom,
    opts: Options,
    meta: Meta,
) -> pulumi.Output[str]:
    """A worker's side: the manager's service account with the least it needs (reads cluster-wide, writes only
    in the namespaces of teams that overflow here), an `overflow` LocalQueue in those namespaces feeding the
    team's own queue (MultiKueue creates its copies with the same queue name), and the account's token."""
    sa = k8s.core.v1.ServiceAccount(
        f"{name}-multikueue-sa",
        metadata=meta(multikueue.MULTIKUEUE_SA, multikueue.MULTIKUEUE_NAMESPACE),
        automount_service_account_token=False,
        opts=opts(depends_on=[release]),
    )
    subject = k8s.rbac.v1.SubjectArgs(
        kind="ServiceAccount", name=multikueue.MULTIKUEUE_SA, namespace=multikueue.MULTIKUEUE_NAMESPACE
    )
    roles = {}
    for key, role_name, rules in (
        ("read", multikueue.MULTIKUEUE_READ_ROLE, multikueue.multikueue_read_rules(frameworks)),
        ("write", multikueue.MULTIKUEUE_WRITE_ROLE, multikueue.multikueue_write_rules(frameworks)),
    ):
        roles[key] = k8s.rbac.v1.ClusterRole(
            f"{name}-multikueue-{key}",
            metadata=meta(role_name),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"], verbs=r["verbs"])
                for r in rules
            ],
            opts=opts(),
        )
    k8s.rbac.v1.ClusterRoleBinding(
        f"{name}-multikueue-read-binding",
        metadata=meta(multikueue.MULTIKUEUE_READ_ROLE),
        role_ref=k8s.rbac.v1.RoleRefArgs(
            api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=multikueue.MULTIKUEUE_READ_ROLE
        ),
        subjects=[subject],
        opts=opts(depends_on=[roles["read"], sa]),
    )
    for team in plan.teams_of(region):
        namespace = team_namespaces[team]
        k8s.rbac.v1.RoleBinding(
            f"{name}-multikueue-write-{team}",
            metadata=meta(multikueue.MULTIKUEUE_WRITE_ROLE, namespace),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=multikueue.MULTIKUEUE_WRITE_ROLE
            ),
            subjects=[subject],
            opts=opts(depends_on=[roles["write"], sa, namespaces[team]]),
        )
        custom(
            f"overflow-local-queue-{team}",
            "LocalQueue",
            kueue.OVERFLOW_QUEUE,
            kueue_chart.local_queue_spec(team),
            [queues[team], namespaces[team]],
            namespace=namespace,
        )
    # A long-lived token: MultiKueue reads a static kubeconfig (no exec plugins). The provider waits until the
    # token controller has filled the Secret (pulumi-kubernetes await logic for service-account-token Secrets).
    token = k8s.core.v1.Secret(
        f"{name}-multikueue-token",
        metadata=meta(
            multikueue.MULTIKUEUE_TOKEN_SECRET,
            multikueue.MULTIKUEUE_NAMESPACE,
            annotations={"kubernetes.io/service-account.name": multikueue.MULTIKUEUE_SA},
        ),
        type="kubernetes.io/service-account-token",
        opts=opts(depends_on=[sa]),
    )
    return pulumi.Output.secret(token.data.apply(lambda data: base64.b64decode((data or {})["token"]).decode()))
