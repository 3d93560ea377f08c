"""dlinfra's rules wrapped as CrossGuard policies. Building policies is cheap; only PolicyPack starts a server."""

from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from .rules.catalog import RULES
from .rules.core import Context, Resource, ResourceRule, StackRule

PACK_NAME = "dlinfra"


def resource_from_args(args: ResourceValidationArgs) -> Resource:
    """The rules' view of a resource under validation (its dependencies are not known to resource policies)."""
    provider = args.provider
    return Resource(
        urn=args.urn,
        type=args.resource_type,
        name=args.name,
        inputs=args.props,
        protect=bool(args.opts.protect),
        provider_urn=provider.urn if provider else "",
        provider_inputs=provider.props if provider else {},
    )


def resource_from_stack(resource: PolicyResource) -> Resource:
    """The rules' view of one resource of a stack under validation."""
    return Resource(
        urn=resource.urn,
        type=resource.resource_type,
        name=resource.name,
        inputs=resource.props,
        protect=bool(resource.opts.protect),
        dependencies=tuple(d.urn for d in resource.dependencies),
        provider_urn=resource.provider.urn if resource.provider else "",
        provider_inputs=resource.provider.props if resource.provider else {},
        parent=resource.parent.urn if resource.parent else "",
    )


def _resource_policy(rule: ResourceRule, ctx: Context) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in rule.check(resource_from_args(args), ctx):
            report(message, None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel(rule.level),
    )


def _stack_policy(rule: StackRule, ctx: Context) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        for urn, message in rule.check([resource_from_stack(r) for r in args.resources], ctx):
            report(message, urn)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel(rule.level),
    )


def policies(ctx: Context) -> list[Policy]:
    """One CrossGuard policy per rule in RULES (rules.catalog), with the rule's enforcement level."""
    out: list[Policy] = []
    for rule in RULES:
        if isinstance(rule, ResourceRule):
            out.append(_resource_policy(rule, ctx))
        else:
            out.append(_stack_policy(rule, ctx))
    return out
