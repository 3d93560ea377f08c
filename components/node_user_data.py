"""A node pool's user data: what each new node writes and starts before it joins (the GPU burn-in's expectation,
a MIG pool's layout), rendered from templates/node-user-data.sh.j2. A helper of components/nodepool.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from dlinfra.model import gpu_health, gpu_sharing

TEMPLATES = Path(__file__).parent / "templates"
USER_DATA_LIMIT = 16384  # bytes before base64 (EC2 API reference, RunInstances UserData: "limited to 16 KB")

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)


def render_user_data(
    *, pool: str, cluster_name: str, region: str, labels: Mapping[str, str], taints: Sequence[tuple[str, str, str]],
    max_pods: int | None, cluster_dns: Sequence[str], gpu_expectation: str | None = None, mig_layout: str | None = None,
) -> str:  # fmt: skip
    """The node's user data: on GPU pools (`gpu_expectation` given) the burn-in's expectation, its start and the
    burn-in taint, where the image has the check; then the join. Everything else is baked into the image.

    The burn-in taint is not among the autoscaler's node-template tags (autoscaler_tags): the autoscaler knows it as
    a startup taint, one a node sheds by itself, so a job that does not tolerate it still scales the pool up
    (components/charts/autoscaler.py)."""
    text = _ENV.get_template("node-user-data.sh.j2").render(
        pool=pool,
        cluster_name=cluster_name,
        region=region,
        labels=",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        taints=",".join(f"{k}={v}:{e}" for k, v, e in taints),
        max_pods=max_pods or "",
        cluster_dns=",".join(cluster_dns),
        gpu_expectation=gpu_expectation,
        expect_path=gpu_health.EXPECT_PATH,
        check_unit=gpu_health.CHECK_UNIT,
        burn_in_taint="{}={}:{}".format(*gpu_health.BURN_IN_TAINT),
        mig_layout=mig_layout,
        mig_layout_path=gpu_sharing.MIG_LAYOUT_PATH,
        mig_unit=gpu_sharing.MIG_UNIT,
        mig_defer_reboot=gpu_sharing.MIG_DEFER_REBOOT,
    )
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(
            f"{pool}: user data is {len(text.encode())} bytes, over EC2's {USER_DATA_LIMIT} (fewer instance types)"
        )
    return text
