"""Rules every AWS and Kubernetes resource follows, whatever its area: standard tags, an explicit provider."""

from __future__ import annotations

import re

from dlinfra.model.naming import STANDARD_TAG_KEYS

from .core import Context, Resource, tags_of

REQUIRED_TAGS = STANDARD_TAG_KEYS  # project, environment, region, component, managed-by

# Packages whose resources must name their provider: Pulumi.yaml disables their default providers, and a
# default provider takes the region or cluster of whoever runs `pulumi up`.
EXPLICIT_PROVIDER_PACKAGES = frozenset({"aws", "kubernetes"})
# A stack named after a region (`<env>-<region>`, `<env>-<region>-k8s`): its AWS resources belong in that region.
_STACK_REGION = re.compile(r"^[a-z0-9]+-(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)(?:-k8s)?$")


def required_tags(resource: Resource, ctx: Context) -> list[str]:
    """Taggable AWS resources carry project, environment, region, component and managed-by."""
    if not resource.type.startswith("aws:") or not ctx.taggable(resource.type):
        return []
    tags = tags_of(resource)
    missing = [key for key in REQUIRED_TAGS if not tags.get(key)]
    if not missing:
        return []
    return [f"missing required tags: {', '.join(missing)} (set tags from Names.tags(...))"]


def explicit_provider(resource: Resource, ctx: Context) -> list[str]:
    """AWS and Kubernetes resources go through an explicit provider, and a regional stack's AWS provider is in the
    stack name's region.

    Pulumi creates a default provider for a resource that names none, configured from the environment of the
    person or runner applying (AWS_REGION, the profile, the current kubeconfig context): a stack applied from the
    wrong shell would then create protected keys and IAM in another region, or objects in another cluster.
    Source: Pulumi docs, "Providers" (default providers, disabling default providers).
    """
    package = resource.type.split(":", 1)[0]
    if package not in EXPLICIT_PROVIDER_PACKAGES:
        return []
    provider_name = resource.provider_urn.rsplit("::", 1)[-1] if resource.provider_urn else ""
    if not provider_name or provider_name.startswith("default"):
        return [f"uses the default {package} provider: pass the stack's explicit provider"]
    match = _STACK_REGION.match(resource.stack)
    region = resource.provider_inputs.get("region")
    if package == "aws" and match and region != match.group("region"):
        return [f"provider region is {region!r}, but the stack {resource.stack} is in {match.group('region')}"]
    return []
