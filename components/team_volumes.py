"""What storage a team's pods may mount, declared as children of the Platform (not a component of its own).

- EFS through the CSI driver only, with IAM: a static PersistentVolume per planned volume (the datasets, the team's
  directory, each member's home; dlinfra.model.team_storage), each onto one access point and reserved for one claim
  in one team's namespace, and the dynamic storage class for per-claim directories. Mount option `iam` makes the
  driver's node pod authenticate as its own role (components/efs_policy.py); TLS is the driver's default for every
  mount and always on for access point mounts (aws-efs-csi-driver pkg/driver/node.go: `tls` in mountOptions is
  deprecated), and the file system policy refuses any mount without it.
- No other way in: a ValidatingAdmissionPolicy bound to every team namespace admits pods whose volumes are only of
  the kinds Pod Security's `restricted` profile allows (configMap, csi, downwardAPI, emptyDir, ephemeral,
  persistentVolumeClaim, projected, secret: Kubernetes "Pod Security Standards", "Volume Types"), and no inline
  CSI volume of the EFS driver. That closes inline `nfs` (which `baseline`, the namespaces' enforced level, allows)
  and `hostPath`. `restricted` itself is not enforced: it also requires non-root users and dropping every
  capability, which the research images and EFA training pods do not do (tests/fixtures/k8s/efa-training-pod.yaml).
  ValidatingAdmissionPolicy is GA in admissionregistration.k8s.io/v1 since Kubernetes 1.30 (Kubernetes docs,
  "Validating Admission Policy"); the fleet runs 1.33.
- The claims stay: a member with `edit` may delete claims in the team's namespace, and a deleted claim leaves its
  Retain volume Released, reserved by uid for a claim that no longer exists, so the next apply's new claim never
  binds (Kubernetes docs "Persistent Volumes": Retain, Released). A second policy (CLAIM_POLICY) lets only those
  who may delete PersistentVolumes (cluster admins, the apply role: never `edit`) delete the claims this program
  manages, or strip the label that marks them; the apply removes a member's claim when the fleet does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.charts.kueue import TEAM_LABEL
from dlinfra.model import team_storage

EFS_STORAGE_CLASS = "efs"  # dynamically provisioned EFS access points (per-claim directories)
EFS_DRIVER = "efs.csi.aws.com"
# EFS is elastic and ignores sizes, but Kubernetes requires one on a PV and its claim.
VOLUME_SIZE = "1Pi"
# `iam`: the node pod's IAM identity authenticates the mount (aws-efs-csi-driver docs/parameters.md).
MOUNT_OPTIONS = ("iam",)
# The driver's documented defaults for dynamic access points, stated so the team and person ids of
# dlinfra.model.team_storage (from 2**30 up) visibly never meet them.
DYNAMIC_GID_RANGE = ("50000", "7000000")
VOLUME_POLICY = "dlinfra-team-volumes"
# Volume sources Pod Security's restricted profile allows; anything else (nfs, hostPath, iscsi, ...) is refused.
ALLOWED_VOLUME_SOURCES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
)  # fmt: skip
VOLUME_RULE = (
    "!has(object.spec.volumes) || object.spec.volumes.all(v, "
    + " || ".join(
        f"(has(v.csi) && v.csi.driver != '{EFS_DRIVER}')" if source == "csi" else f"has(v.{source})"
        for source in ALLOWED_VOLUME_SOURCES
    )
    + ")"
)
VOLUME_MESSAGE = (
    "team namespaces mount shared storage only through their claims: volumes may be "
    + ", ".join(ALLOWED_VOLUME_SOURCES)
    + f" (no inline {EFS_DRIVER}); nfs, hostPath and other host or network volumes are refused"
)

CLAIM_POLICY = "dlinfra-team-claims-kept"
MANAGED_BY = ("app.kubernetes.io/managed-by", "pulumi-dlinfra")  # the label Platform._meta gives every object
# CEL's authorizer asks the API server's own authorizers (RBAC and EKS access policies) about the requester
# (Kubernetes docs, "Validating Admission Policy": the `authorizer` variable). PersistentVolumes are cluster-scoped:
# the `edit` role of a namespace cannot delete them, cluster admins and the apply role can.
ADMIN_CHECK = "authorizer.group('').resource('persistentvolumes').check('delete').allowed()"


def _managed(obj: str) -> str:
    key, value = MANAGED_BY
    return (
        f"has({obj}.metadata.labels) && '{key}' in {obj}.metadata.labels && {obj}.metadata.labels['{key}'] == '{value}'"
    )


Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]


def volume_name(claim: str, namespace: str) -> str:
    """The PersistentVolume reserved for one claim of one namespace (a PV binds one claim)."""
    return f"{claim}-{namespace}"


def declare(
    name: str,
    *,
    file_system_id: pulumi.Input[str],
    access_point_ids: pulumi.Input[Mapping[str, str]],
    volumes: Sequence[team_storage.Volume],
    namespaces: Mapping[str, tuple[str, pulumi.Resource]],
    opts: Options,
    meta: Meta,
) -> k8s.storage.v1.StorageClass:
    """The storage class, every planned volume and claim, and the volume policy; `namespaces`: team ->
    (namespace, its Namespace resource). `opts` and `meta` are the Platform's option and metadata makers."""
    storage_class = k8s.storage.v1.StorageClass(
        f"{name}-efs",
        metadata=meta(EFS_STORAGE_CLASS),
        provisioner=EFS_DRIVER,
        parameters={
            "provisioningMode": "efs-ap",
            "fileSystemId": file_system_id,
            "directoryPerms": "700",
            "basePath": "/dynamic",
            "gidRangeStart": DYNAMIC_GID_RANGE[0],
            "gidRangeEnd": DYNAMIC_GID_RANGE[1],
        },
        mount_options=list(MOUNT_OPTIONS),
        # Deleting a claim must not delete research data; directories are removed deliberately.
        reclaim_policy="Retain",
        volume_binding_mode="Immediate",
        opts=opts(),
    )
    ids = pulumi.Output.from_input(access_point_ids)
    for volume in volumes:
        namespace, namespace_resource = namespaces[volume.team]
        mode = "ReadOnlyMany" if volume.read_only else "ReadWriteMany"
        handle = pulumi.Output.concat(file_system_id, "::", ids.apply(_access_point_id(volume.access_point)))
        pv_name = volume_name(volume.claim, namespace)
        k8s.core.v1.PersistentVolume(
            f"{name}-{volume.claim}-{volume.team}",
            metadata=meta(pv_name),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": VOLUME_SIZE},
                access_modes=[mode],
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                volume_mode="Filesystem",
                mount_options=list(MOUNT_OPTIONS),
                # fs-...::fsap-...: the access point's root directory and identity (aws-efs-csi-driver
                # examples/kubernetes/efs/access_points).
                csi=k8s.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=EFS_DRIVER, volume_handle=handle, read_only=volume.read_only or None
                ),
                # Reserved for the team's claim, so no other claim can bind the volume first.
                claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=namespace, name=volume.claim),
            ),
            opts=opts(),
        )
        k8s.core.v1.PersistentVolumeClaim(
            f"{name}-{volume.claim}-claim-{volume.team}",
            metadata=meta(volume.claim, namespace),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=[mode],
                storage_class_name="",
                volume_name=pv_name,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": VOLUME_SIZE}),
            ),
            opts=opts(depends_on=[namespace_resource]),
        )
    _volume_policy(name, opts, meta)
    _claim_policy(name, opts, meta)
    return storage_class


def _access_point_id(key: str) -> Callable[[Mapping[str, str]], str]:
    return lambda points: str(points[key])


def volume_policy_spec() -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """Pods may only have the volume kinds of ALLOWED_VOLUME_SOURCES, and no inline EFS CSI volume."""
    return k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
        # A policy that cannot be evaluated refuses the pod rather than letting an nfs volume through.
        failure_policy="Fail",
        match_constraints=k8s.admissionregistration.v1.MatchResourcesArgs(
            resource_rules=[
                k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
                    api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"]
                )
            ]
        ),
        validations=[
            k8s.admissionregistration.v1.ValidationArgs(
                expression=VOLUME_RULE, message=VOLUME_MESSAGE, reason="Forbidden"
            )
        ],
    )


def volume_policy_binding_spec() -> k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs:
    """The policy denies in every namespace labelled as a team's (a team cannot relabel its namespace: `edit`)."""
    return k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
        policy_name=VOLUME_POLICY,
        validation_actions=["Deny"],
        match_resources=k8s.admissionregistration.v1.MatchResourcesArgs(
            namespace_selector=k8s.meta.v1.LabelSelectorArgs(
                match_expressions=[k8s.meta.v1.LabelSelectorRequirementArgs(key=TEAM_LABEL, operator="Exists")]
            )
        ),
    )


def _volume_policy(name: str, opts: Options, meta: Meta) -> None:
    policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
        f"{name}-volume-policy", metadata=meta(VOLUME_POLICY), spec=volume_policy_spec(), opts=opts()
    )
    k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
        f"{name}-volume-policy-binding",
        metadata=meta(VOLUME_POLICY),
        spec=volume_policy_binding_spec(),
        opts=opts(depends_on=[policy]),
    )


def claim_policy_spec() -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """Deleting a managed claim, or taking its label off, only by someone who may delete PersistentVolumes. On a
    DELETE, `oldObject` is the claim (Kubernetes docs, "Validating Admission Policy": object is null then)."""
    admission = k8s.admissionregistration.v1
    return admission.ValidatingAdmissionPolicySpecArgs(
        failure_policy="Fail",
        match_constraints=admission.MatchResourcesArgs(
            resource_rules=[
                admission.NamedRuleWithOperationsArgs(
                    api_groups=[""], api_versions=["v1"], operations=["DELETE", "UPDATE"],
                    resources=["persistentvolumeclaims"],
                )
            ]
        ),
        match_conditions=[admission.MatchConditionArgs(name="managed-claim", expression=_managed("oldObject"))],
        variables=[admission.VariableArgs(name="admin", expression=ADMIN_CHECK)],
        validations=[
            admission.ValidationArgs(
                expression=f"variables.admin || (request.operation == 'UPDATE' && {_managed('object')})",
                message="the team's claims (datasets, team, home-<person>) come and go with the fleet: deleting one "
                "leaves its volume Released and the next apply's claim unbound; remove the person from the fleet "
                "instead, or ask an admin",
                reason="Forbidden",
            )
        ],
    )  # fmt: skip


def _claim_policy(name: str, opts: Options, meta: Meta) -> None:
    policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
        f"{name}-claim-policy", metadata=meta(CLAIM_POLICY), spec=claim_policy_spec(), opts=opts()
    )
    k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
        f"{name}-claim-policy-binding",
        metadata=meta(CLAIM_POLICY),
        spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
            policy_name=CLAIM_POLICY,
            validation_actions=["Deny"],
            match_resources=volume_policy_binding_spec().match_resources,
        ),
        opts=opts(depends_on=[policy]),
    )
