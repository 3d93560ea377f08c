"""The state rules: what holds data is protected, and only that."""

from __future__ import annotations

import dataclasses

from policy.dlinfra_policy.rules.allowlists import COSTLY_TO_LOSE
from policy.dlinfra_policy.rules.core import Resource
from policy.dlinfra_policy.rules.state import STATEFUL_TYPES
from tests.policy.rules._resources import CTX, messages, pass_and_fail, res

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "stateful-protected": (
        [res("aws:efs/fileSystem:FileSystem", protect=True)(encrypted=True)],
        [res("aws:efs/fileSystem:FileSystem")(encrypted=True)],
    ),
    "protect-only-stateful": (
        [res("aws:efs/fileSystem:FileSystem", protect=True)(encrypted=True), res("aws:eks/accessEntry:AccessEntry")()],
        [
            res("aws:eks/accessEntry:AccessEntry", protect=True)(),
            res("aws:efs/mountTarget:MountTarget", protect=True)(),
        ],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_stateful_list_names_its_types() -> None:
    assert {"aws:efs/fileSystem:FileSystem", "aws:s3/bucket:Bucket", "aws:kms/key:Key"} <= set(STATEFUL_TYPES)


def test_protect_only_stateful_accepts_a_costly_type_with_a_reason() -> None:
    """What holds no data may still be protected on purpose, but only when COSTLY_TO_LOSE says why."""
    ca_key = res("tls:index/privateKey:PrivateKey", protect=True)(algorithm="RSA")
    assert messages("protect-only-stateful", [ca_key]) != []
    costly = dataclasses.replace(CTX, costly_to_lose={ca_key.type: "a new CA invalidates every laptop profile"})
    assert messages("protect-only-stateful", [ca_key], costly) == []
    for type_, reason in COSTLY_TO_LOSE.items():
        assert reason.strip() and type_ not in STATEFUL_TYPES, type_
