"""What every rule shares: the resource and context types, the rule types and helpers that read inputs."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from .allowlists import COSTLY_TO_LOSE, INGRESS_ALLOWLIST, IngressException

Level = Literal["mandatory", "advisory"]


@dataclass(frozen=True)
class Resource:
    """One resource as the rules see it."""

    urn: str
    type: str
    name: str
    inputs: Mapping[str, Any]  # camelCase, as the provider sees them
    protect: bool = False
    dependencies: tuple[str, ...] = ()  # URNs of the resources this one depends on
    id: str = ""  # known in offline plans; empty during a real preview of a new resource
    provider_urn: str = ""  # URN of the provider the resource goes through; empty when unknown
    provider_inputs: Mapping[str, Any] = field(default_factory=dict)  # that provider's inputs (region, ...)
    parent: str = ""  # URN of the parent resource; empty for a top-level one or when unknown

    @property
    def stack(self) -> str:
        """The stack in the URN (`urn:pulumi:<stack>::<project>::<type>::<name>`)."""
        return self.urn.removeprefix("urn:pulumi:").split("::", 1)[0]


class Violation(NamedTuple):
    """A stack rule's finding: which resource, and what is wrong."""

    urn: str
    message: str


@dataclass(frozen=True)
class AddressPlan:
    """The committed address plan, as the VPC rule needs it."""

    vpcs: Mapping[str, ipaddress.IPv4Network]  # stack name -> its planned VPC block
    vpc_keys: Mapping[str, str]  # stack name -> the VPC's allocation key (vpc/<env>/<region>)
    blocks: Mapping[str, ipaddress.IPv4Network]  # every top-level allocation key -> block (VPCs, LANs, pools)
    source: str = "cidr-lock.yaml"


@dataclass(frozen=True)
class Context:
    """What rules need beyond the resources: facts from the provider SDK, instance table and address plan."""

    taggable: Callable[[str], bool]  # does a type token accept `tags`? (read from the provider SDK)
    gpu_count: Callable[[str], int | None]  # NVIDIA GPUs of an instance type; None when the type is unknown
    address_plan: AddressPlan | None = None
    address_plan_error: str = ""  # why the plan could not be loaded: reported as a violation, never ignored
    ingress_allowlist: tuple[IngressException, ...] = INGRESS_ALLOWLIST
    # type -> why it is protected though it holds no data
    costly_to_lose: Mapping[str, str] = field(default_factory=lambda: COSTLY_TO_LOSE)
    today: datetime.date | None = None  # the date version-support checks use; None: dlinfra.model.eks.today()


ResourceCheck = Callable[[Resource, Context], list[str]]
StackCheck = Callable[[Sequence[Resource], Context], list[Violation]]


@dataclass(frozen=True)
class ResourceRule:
    """A rule over one resource at a time (a CrossGuard ResourceValidationPolicy)."""

    name: str
    description: str
    level: Level
    check: ResourceCheck


@dataclass(frozen=True)
class StackRule:
    """A rule over every resource of a stack (a CrossGuard StackValidationPolicy)."""

    name: str
    description: str
    level: Level
    check: StackCheck


# Inputs may be plain dicts and lists (plan exports) or the policy SDK's read-only proxies, which raise when a
# value is unknown during preview; so the rules read them only through the Mapping and Sequence protocols.


def as_list(value: Any) -> list[Any]:
    """A list value as a list; None as empty; a scalar as a one-item list."""
    if value is None:
        return []
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return [value]


def as_objects(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a list value (or the value itself when it is one object)."""
    if isinstance(value, Mapping):
        return [value]
    return [v for v in as_list(value) if isinstance(v, Mapping)]


def as_object(value: Any) -> Mapping[str, Any]:
    """A nested object, or an empty one (Terraform-style single-item lists are accepted too)."""
    objects = as_objects(value)
    return objects[0] if objects else {}


def is_true(value: Any) -> bool:
    """True for a boolean true or the string "true" (some AWS inputs, like launch template ebs, are strings)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def as_int(value: Any) -> int | None:
    """An integer from an int, an integral float (the engine sends numbers as floats) or a digit string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def has_key(mapping: Mapping[str, Any], key: str) -> bool:
    """True when an input is set, without reading its value (a key ARN is unknown until the key exists)."""
    # Iterating keys never touches values; `in` on the policy SDK's proxy would read (and raise on) the value.
    return any(k == key for k in mapping)


def tags_of(resource: Resource) -> dict[str, str]:
    """A resource's tags: a map for most types, a list of {key, value} for Auto Scaling groups."""
    raw = resource.inputs.get("tags")
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items() if v is not None}
    return {str(t.get("key")): str(t.get("value")) for t in as_objects(raw) if t.get("key") is not None}


def refers_to(child: Resource, parent: Resource, key: str) -> bool:
    """True when `child` points at `parent` through input `key` (by dependency, id or physical name)."""
    if parent.urn in child.dependencies:
        return True
    target = child.inputs.get(key)
    names = {parent.id, parent.inputs.get("bucket"), parent.inputs.get("name")} - {None, ""}
    return isinstance(target, str) and target in names


VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def deny_bound_policies(resources: Sequence[Resource]) -> set[str]:
    """Names of the ValidatingAdmissionPolicies a binding enforces (validationActions Deny), not just audits."""
    return {
        str(spec.get("policyName"))
        for r in resources
        if r.type == VAP_BINDING
        for spec in [as_object(r.inputs.get("spec"))]
        if "Deny" in as_list(spec.get("validationActions"))
    }


TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
LIFECYCLE_HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"


def termination_hooks(group: Resource, resources: Sequence[Resource]) -> list[Mapping[str, Any]]:
    """The group's termination hooks as AWS will hold them: a LifecycleHook resource on the group replaces the
    initial hook of the same name (PutLifecycleHook creates or updates a hook by name)."""
    hooks = {str(h.get("name")): h for h in as_objects(group.inputs.get("initialLifecycleHooks"))}
    for r in resources:
        target = r.inputs.get("autoscalingGroupName")
        if r.type == LIFECYCLE_HOOK and (group.urn in r.dependencies or target == group.inputs.get("name")):
            hooks[str(r.inputs.get("name"))] = r.inputs
    return [h for _, h in sorted(hooks.items()) if h.get("lifecycleTransition") == TERMINATING]
