"""Just enough of IAM's policy evaluation to ask who may do what to a file system (tests only).

An explicit Deny in any policy wins; otherwise an Allow in the resource policy or in the caller's identity policy
allows (IAM user guide, "Policy evaluation logic", same account); nothing else allows. Conditions: Bool,
StringEquals, StringLike and their negations, with IAM's rule that a negated operator matches when the key is
absent and a positive one does not. Principals: "*" and {"AWS": "*" | arn}. Enough for the EFS documents.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Request:
    principal: str  # a role ARN, or ANONYMOUS (an NFS mount without the `iam` option)
    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)  # condition keys present, as strings


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(patterns: Any, value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, str(p)) for p in _list(patterns))


def _principal(statement: Mapping[str, Any], principal: str) -> bool:
    if "Principal" not in statement:
        return True  # an identity policy: it is the caller's own
    given = statement["Principal"]
    if given == "*":
        return True
    aws = _list(given.get("AWS", []))
    return "*" in aws or principal in aws


def _condition(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, keys in condition.items():
        negated = "Not" in operator
        for key, wanted in keys.items():
            if key not in context:
                if not negated:
                    return False
                continue
            value = context[key]
            if operator.startswith("Bool"):
                hit = value.lower() in [str(w).lower() for w in _list(wanted)]
            elif "Like" in operator:
                hit = _matches(wanted, value)
            else:
                hit = value in [str(w) for w in _list(wanted)]
            if hit == negated:
                return False
    return True


def _applies(statement: Mapping[str, Any], request: Request) -> bool:
    return (
        _principal(statement, request.principal)
        and _matches(statement["Action"], request.action)
        and _matches(statement.get("Resource", "*"), request.resource)
        and _condition(statement.get("Condition", {}), request.context)
    )


def allowed(
    request: Request, resource_policy: Mapping[str, Any], identity_policies: Sequence[Mapping[str, Any]]
) -> bool:
    """IAM's answer for a request in the file system's own account."""
    identity = [] if request.principal == ANONYMOUS else list(identity_policies)
    statements = [s for doc in (resource_policy, *identity) for s in _list(doc["Statement"])]
    applying = [s for s in statements if _applies(s, request)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    return any(s["Effect"] == "Allow" for s in applying)
