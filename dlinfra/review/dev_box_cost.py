"""What dev boxes cost: each box's on-demand hourly price, and a month at most (running every hour); a box that its
idle stop keeps stopped costs less, down to nothing for its instance (its root volume is billed while stopped, and
is in cost.NOT_COUNTED_ALWAYS with every EBS volume). Pure: reads plan resources; cost.price_stack adds the items."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlinfra.model.dev_boxes import DEV_BOX_TAG

INSTANCE = "aws:ec2/instance:Instance"
LABEL = "dev box"
NOTE = "0 h when stopped all month; billed per second while running (idle boxes stop themselves)"


@dataclass(frozen=True)
class Item:
    """One box as cost.py prices it: on demand, 0 to every hour of the month."""

    label: str
    price_key: str
    hours_min: float
    hours_max: float
    detail: str
    note: str
    where: str


def items(resources: Sequence[Mapping[str, Any]], hours_per_month: float) -> Iterator[Item]:
    """An item per instance of the plan (dev boxes by their person; any other lone instance by its name)."""
    for r in resources:
        if r["type"] != INSTANCE:
            continue
        inputs = r["inputs"]
        person = (inputs.get("tags") or {}).get(DEV_BOX_TAG)
        kind = str(inputs.get("instanceType"))
        label = f"{LABEL} {person} ({kind})" if person else f"instance {r['name']} ({kind})"
        yield Item(label, f"ec2/{kind}", 0.0, hours_per_month, f"0..1 x {hours_per_month:g} h", NOTE, r["name"])


@dataclass(frozen=True)
class EnvironmentBoxes:
    """An environment's dev boxes together: how many, what they cost an hour all running, and a month at most."""

    boxes: int
    usd_per_hour: float
    usd_month_max: float


def by_environment(stacks: Sequence[Any]) -> dict[str, EnvironmentBoxes]:
    """Dev boxes of a cost report (its StackCost items), summed per environment (the regional stack's name less its
    region: `<env>-<region>`)."""
    out: dict[str, EnvironmentBoxes] = {}
    for stack in stacks:
        env = str(stack.stack).removesuffix(f"-{stack.region}")
        for item in stack.items:
            if not item.label.startswith(f"{LABEL} "):
                continue
            seen = out.get(env, EnvironmentBoxes(0, 0.0, 0.0))
            out[env] = EnvironmentBoxes(
                seen.boxes + 1,
                round(seen.usd_per_hour + item.usd_each, 4),
                round(seen.usd_month_max + item.usd_max, 2),
            )
    return dict(sorted(out.items()))
