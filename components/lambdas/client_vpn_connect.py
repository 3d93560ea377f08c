"""AWS Client VPN client connect handler: admits only the certificates of the people the fleet lists.

Client VPN calls it for every new connection, after the certificate is verified and before authorization rules
(AWS Client VPN administrator guide, "Connection authorization"). Removing a person from
`environments.<env>.client_vpn.users` removes their certificate's common name from ALLOWED_COMMON_NAMES, so
their next connection is refused although the certificate itself stays valid until it expires.
"""

from __future__ import annotations

import json
import os
from typing import Any

DENIED = "this VPN certificate is no longer admitted (not in the fleet's client_vpn.users); ask the infra team"


def decide(common_name: str, allowed: frozenset[str]) -> dict[str, Any]:
    """The handler's answer in Client VPN's response schema (v3)."""
    allow = common_name in allowed
    return {
        "allow": allow,
        "error-msg-on-denied-connection": "" if allow else DENIED,
        "posture-compliance-statuses": [],
        "schema-version": "v3",
    }


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    """Lambda entry point: the request carries the client certificate's common name."""
    allowed = frozenset(json.loads(os.environ["ALLOWED_COMMON_NAMES"]))
    return decide(str(event.get("common-name", "")), allowed)
