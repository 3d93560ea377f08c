"""The design's reviewed exceptions each give a reason."""

from __future__ import annotations

from policy.dlinfra_policy.rules.allowlists import INGRESS_ALLOWLIST


def test_design_allowlist_is_documented() -> None:
    assert all(len(e.reason) > 20 for e in INGRESS_ALLOWLIST)
