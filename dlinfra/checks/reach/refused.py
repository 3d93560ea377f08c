"""What the reachability model refuses to judge rather than guess: IPv6, which it does not model (the check fails
naming the resource and the setting; docs/reachability.md, "What the model does not cover")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Values that leave an IPv6 setting off, as the provider may give them.
_OFF: tuple[Any, ...] = (None, False, "", 0, [], {}, "false", "False", "0")


def ipv6_setting(r: Mapping[str, Any]) -> str | None:
    """What of a network resource declares IPv6 (which this model does not evaluate), or None."""
    t = str(r["type"])
    if not t.startswith(("aws:ec2", "aws:vpc/", "aws:eks/")):
        return None
    if "egressOnlyInternetGateway" in t or "Ipv6" in t:
        return t.split(":")[-1]

    def walk(value: Any, path: str) -> str | None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key == "tags":
                    continue
                where = f"{path}.{key}" if path else str(key)
                lowered = str(key).lower()
                if "ipv6" in lowered and item not in _OFF:
                    return where
                if lowered == "ipfamily" and str(item).lower() == "ipv6":
                    return where
                if "cidr" in lowered and isinstance(item, str) and ":" in item:
                    return where
                found = walk(item, where)
                if found:
                    return found
        elif isinstance(value, list):
            for n, item in enumerate(value):
                found = walk(item, f"{path}[{n}]")
                if found:
                    return found
        return None

    return walk(r["inputs"], "")
