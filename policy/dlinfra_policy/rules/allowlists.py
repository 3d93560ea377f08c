"""What the design allows that a rule would otherwise flag, each entry with the reason a reviewer checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class IngressException:
    """A security-group ingress from anywhere that the design allows, and why."""

    component: str  # `component` tag of the security group (inline rules) or of the rule resource
    protocol: str  # "tcp", "udp", "icmp" or "-1" (all)
    from_port: int
    to_port: int
    reason: str  # why the whole internet must reach this port; reviewed like code


# Empty on purpose: nothing dlinfra declares must be reachable from the internet through a security group.
# The Client VPN endpoint in particular needs no such rule: AWS terminates the laptops' OpenVPN sessions
# (443/udp) on its managed endpoint before any security group applies, and the endpoint's security group
# only governs traffic from the endpoint's interfaces into the VPC. Opening 443/udp to the world there
# would only widen what reaches those interfaces. Add an entry only with a reason a reviewer can check.
INGRESS_ALLOWLIST: tuple[IngressException, ...] = ()

# Protected on purpose though they hold no data: losing one costs more than re-creating it (say, a CA whose
# replacement invalidates every laptop's VPN profile). Each entry gives its reason; `protect-only-stateful` lets them
# be protected. Empty on purpose: everything dlinfra protects today is in STATEFUL_TYPES (grep protect=True in
# components/). Add an entry only with a reason a reviewer can check.
COSTLY_TO_LOSE: Mapping[str, str] = MappingProxyType({})
