"""The CrossGuard policy pack: `pulumi preview --policy-pack policy`. The only place that builds PolicyPack.

Constructing PolicyPack starts the analyzer's gRPC server and never returns, so nothing imports this file;
the rules live in dlinfra_policy/rules/ and are tested offline.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the rules read the address plan through dlinfra, which lives at the root
    sys.path.insert(0, str(ROOT))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policy.dlinfra_policy import pack  # noqa: E402
from policy.dlinfra_policy.context import build_context  # noqa: E402

# The fleet and lock the stacks read; DLINFRA_FLEET / DLINFRA_LOCK override them like dlinfra:fleet/lock do.
fleet = ROOT / os.environ.get("DLINFRA_FLEET", "fleet.yaml")
lock = ROOT / os.environ.get("DLINFRA_LOCK", "cidr-lock.yaml")

PolicyPack(
    name=pack.PACK_NAME,
    policies=pack.policies(build_context(fleet, lock, strict=False)),
    enforcement_level=EnforcementLevel.MANDATORY,
    description="dlinfra: encryption at rest, no public exposure, IMDSv2, planned CIDRs, protected state, tags, "
    "GPU autoscaling and VPN crypto",
)
