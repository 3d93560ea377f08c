"""What of the fleet and the address plan one environment's stacks read: the slice a stack's cached plan is keyed by.

A stack of environment `prod` declares prod's regions, pools, cluster and VPN, the sites that join prod, and
reads the fleet-wide settings (project, tags, address space, service quotas, regions, teams). It never reads
another environment's section, nor a site that joins another environment, nor their address blocks.
So a change to staging leaves prod's plans as they were, and the plan cache (dlinfra.offline.cache) reuses them.
tests/offline/test_cache.py holds this to account: it previews a fixture, changes one environment's pools (a
pool's maximum, a new pool) and compares the other environment's plans, made again from scratch; a site of another
environment and its address blocks are outside the slice by construction (a site joins one environment).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dlinfra.model.fleet.schema import Fleet


def fleet_slice(fleet: Fleet, environment: str) -> dict[str, Any]:
    """The fleet as an environment's stacks read it: every fleet-wide key, that environment alone, its sites."""
    data = fleet.model_dump(mode="json")
    data["environments"] = {environment: data["environments"][environment]}
    data["sites"] = {
        name: spec for name, spec in (data.get("sites") or {}).items() if spec["environment"] == environment
    }
    return data


def lock_slice(fleet: Fleet, allocations: Mapping[str, str], environment: str) -> dict[str, str]:
    """The address-plan allocations an environment's stacks read: those of the environment and of its sites.

    A key names its owner in its second part (`subnet/prod/us-west-2/...`, `site-lan/sjc1`); a key whose owner is
    neither an environment nor a site is kept in every slice, so an unknown kind can only cost a cache miss.
    """
    own_sites = {name for name, site in fleet.sites.items() if site.environment == environment}
    others = (set(fleet.environments) | set(fleet.sites)) - own_sites - {environment}
    return {key: cidr for key, cidr in sorted(allocations.items()) if _owner(key) not in others}


def _owner(key: str) -> str:
    parts = key.split("/")
    return parts[1] if len(parts) > 1 else ""


def digest(value: Any) -> str:
    """sha256 of a value as canonical JSON: equal data, equal digest, in any process and whatever order it was
    written in (mapping keys and set members sorted; dataclasses by their fields)."""
    return hashlib.sha256(json.dumps(canonical(value), sort_keys=True).encode()).hexdigest()


def canonical(value: Any) -> Any:
    """A value as JSON-able data that does not depend on the process: sets sorted, dataclasses as their class
    name and fields, enums by value, anything else by str() (addresses, paths)."""
    kind = type(value)
    # The bulk of a large value (a network model) is scalars, dicts and lists: those exact types are taken first,
    # as the checks below would take them; a subclass (an IntEnum, a named tuple) still goes through the checks.
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k if isinstance(k, str) else str(canonical(k)): canonical(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [canonical(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__class__": type(value).__name__, **fields}
    if isinstance(value, Mapping):
        return {str(canonical(k)) if not isinstance(k, str) else k: canonical(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


_PLAIN = frozenset({str, int, float, bool, type(None)})
