"""Which team may read or write which EFS path and S3 prefix, read from plan exports (pure, no pulumi import).

EFS: a team's pods mount what the claims in its namespace are bound to (static PersistentVolumes of the
`-k8s` stack, each reserved for one claim by its claimRef); a volume handle `fs-...::fsap-...` names an access point
of the regional stack, whose root directory is the path and whose enforced user is the identity every request takes.
The dynamic storage class gives each new claim a directory of its own. Inline volumes are refused in team
namespaces (components/team_volumes.py), so claims are the only way in.
S3: the team's pods act as the role their namespace's Pod Identity association names; its inline policies' Allow
statements on object ARNs say which bucket prefixes it may read (Get*) or also write (Put*, Delete*).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlinfra.checks.plans import Plan

TEAM_LABEL = "dlinfra.io/team"  # components/charts/kueue.py TEAM_LABEL: a team's namespace
EFS_DRIVER = "efs.csi.aws.com"
_READ = ("s3:GetObject", "s3:GetObjectVersion")
_WRITE_PREFIXES = ("s3:Put", "s3:Delete", "s3:AbortMultipartUpload")


@dataclass(frozen=True)
class DataGrant:
    """One place a team's pods may read, or read and write."""

    region: str
    store: str  # "efs" or "s3"
    location: str  # an EFS path, or s3://bucket/prefix
    access: str  # "read" or "read-write"
    via: str  # the claim, storage class or pod identity that gives it
    identity: str = ""  # EFS: the POSIX user (uid) every request through the access point takes


def _resources(plan: Plan, type_: str) -> Iterable[Mapping[str, Any]]:
    return (r for r in plan.resources if r["type"] == type_)


def _key(plan: Plan) -> tuple[str, str]:
    role = plan.data["role"]
    return str(role.get("environment") or ""), str(role.get("region") or "")


def _team_namespaces(plan: Plan) -> dict[str, str]:
    """Namespace -> team, from the namespaces' team label."""
    out = {}
    for ns in _resources(plan, "kubernetes:core/v1:Namespace"):
        meta = ns["inputs"].get("metadata", {})
        team = (meta.get("labels") or {}).get(TEAM_LABEL)
        if team:
            out[str(meta.get("name"))] = str(team)
    return out


def _efs(k8s: Plan, regional: Plan | None, namespaces: Mapping[str, str]) -> dict[str, list[DataGrant]]:
    region = _key(k8s)[1]
    points = {
        str(r["id"]): r["inputs"] for r in (_resources(regional, "aws:efs/accessPoint:AccessPoint") if regional else ())
    }
    out: dict[str, list[DataGrant]] = {}
    for pv in _resources(k8s, "kubernetes:core/v1:PersistentVolume"):
        spec = pv["inputs"].get("spec", {})
        csi, claim = spec.get("csi") or {}, spec.get("claimRef") or {}
        team = namespaces.get(str(claim.get("namespace")))
        if csi.get("driver") != EFS_DRIVER or team is None:
            continue
        access_point = str(csi.get("volumeHandle", "")).rpartition("::")[2]
        point = points.get(access_point, {})
        path = (point.get("rootDirectory") or {}).get("path") or f"(access point {access_point or '?'})"
        uid = (point.get("posixUser") or {}).get("uid")
        out.setdefault(team, []).append(
            DataGrant(
                region, "efs", str(path), "read" if csi.get("readOnly") else "read-write",
                f"claim {claim.get('name')} in {claim.get('namespace')}", "" if uid is None else str(int(uid)),
            )
        )  # fmt: skip
    for sc in _resources(k8s, "kubernetes:storage.k8s.io/v1:StorageClass"):
        if sc["inputs"].get("provisioner") != EFS_DRIVER:
            continue
        base = (sc["inputs"].get("parameters") or {}).get("basePath") or ""
        name = (sc["inputs"].get("metadata") or {}).get("name")
        for team in set(namespaces.values()):
            out.setdefault(team, []).append(
                DataGrant(region, "efs", f"{base}/<a new directory per claim>", "read-write", f"storage class {name}",
                          "one per claim, from the driver's range")
            )  # fmt: skip
    return out


def _policy_statements(policy: Any) -> list[Mapping[str, Any]]:
    try:
        doc = json.loads(policy) if isinstance(policy, str) else {}
    except json.JSONDecodeError:
        return []
    statements = doc.get("Statement", [])
    return [s for s in (statements if isinstance(statements, list) else [statements]) if isinstance(s, dict)]


def _listed(value: Any) -> list[str]:
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def _s3(regional: Plan, namespaces: Mapping[str, str]) -> dict[str, list[DataGrant]]:
    region = _key(regional)[1]
    roles = {
        str(r["outputs"].get("arn") or ""): str(r["inputs"].get("name"))
        for r in _resources(regional, "aws:iam/role:Role")
    }
    policies: dict[str, list[Mapping[str, Any]]] = {}
    for p in _resources(regional, "aws:iam/rolePolicy:RolePolicy"):
        policies.setdefault(str(p["inputs"].get("role")), []).extend(_policy_statements(p["inputs"].get("policy")))
    out: dict[str, list[DataGrant]] = {}
    for assoc in _resources(regional, "aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        inputs = assoc["inputs"]
        team = namespaces.get(str(inputs.get("namespace")))
        if team is None:
            continue
        role = roles.get(str(inputs.get("roleArn")), str(inputs.get("roleArn")).rpartition("/")[2])
        actions: dict[str, set[str]] = {}
        for s in policies.get(role, []):
            if s.get("Effect") != "Allow":
                continue
            for resource in _listed(s.get("Resource")):
                if resource.startswith("arn:aws:s3:::") and "/" in resource:
                    actions.setdefault(resource, set()).update(_listed(s.get("Action")))
        via = f"pods of {inputs.get('namespace')} as {inputs.get('serviceAccount')}: role {role}"
        for resource, allowed in sorted(actions.items()):
            if not allowed & {*_READ, "s3:*", "s3:Get*"}:
                continue
            write = any(a == "s3:*" or a.startswith(_WRITE_PREFIXES) for a in allowed)
            location = "s3://" + resource.removeprefix("arn:aws:s3:::").removesuffix("*")
            out.setdefault(team, []).append(DataGrant(region, "s3", location, "read-write" if write else "read", via))
    return out


def team_data(plans: Sequence[Plan]) -> dict[tuple[str, str], tuple[DataGrant, ...]]:
    """(environment, team) -> everything the team's pods may read or write, from the regional and `-k8s` plans."""
    regional = {_key(p): p for p in plans if p.data["role"].get("kind") == "regional"}
    grants: dict[tuple[str, str], list[DataGrant]] = {}
    for k8s in (p for p in plans if p.data["role"].get("kind") == "k8s"):
        env, region = _key(k8s)
        namespaces = _team_namespaces(k8s)
        found = [_efs(k8s, regional.get((env, region)), namespaces)]
        if (env, region) in regional:
            found.append(_s3(regional[(env, region)], namespaces))
        for by_team in found:
            for team, items in by_team.items():
                grants.setdefault((env, team), []).extend(items)
    return {
        key: tuple(sorted(set(items), key=lambda g: (g.region, g.store, g.location, g.via)))
        for key, items in grants.items()
    }
