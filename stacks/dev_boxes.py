"""Dev boxes of a regional stack: one DevBox per person whose box the fleet puts in this region."""

from __future__ import annotations

import pulumi

from components.dev_box import DevBox, DevBoxArgs
from components.storage import Storage
from dlinfra.errors import DlinfraError
from dlinfra.model import dev_boxes, images
from stacks.compute import load_manifest
from stacks.context import StackContext


def declare_dev_boxes(
    ctx: StackContext,
    *,
    vpc_id: pulumi.Input[str],
    private_subnet_ids: dict[str, pulumi.Input[str]],
    laptop_security_group_id: pulumi.Input[str] | None,
    client_vpn_endpoint_id: pulumi.Input[str] | None,
    storage: Storage,
    provider: pulumi.ProviderResource,
) -> dict[str, DevBox]:
    """Declare this region's boxes on the node images of their variant; the fleet check made sure the environment
    has a laptop VPN wherever it has boxes."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    planned = dev_boxes.boxes_in(ctx.fleet, env, region)
    if not planned:
        return {}
    assert laptop_security_group_id is not None  # dev_boxes.check_fleet: no box without a laptop VPN
    manifest = load_manifest(ctx)
    vpc_cidr = str(ctx.plan.vpc(env, region))
    boxes: dict[str, DevBox] = {}
    for person, box in planned.items():
        key = f"environments.{env}.dev_boxes.people.{person}"
        try:
            ami = images.ami_for(manifest, box.variant, region)
        except DlinfraError as exc:
            raise DlinfraError(f"{exc.detail} (needed by this dev box)", file=exc.file, key=key) from None
        try:
            args = DevBoxArgs(
                names=ctx.names,
                person=person,
                uid=box.uid,
                instance_type=box.instance_type,
                ami_id=ami,
                subnet_id=private_subnet_ids[box.zone],
                vpc_id=vpc_id,
                vpc_cidr=vpc_cidr,
                laptop_security_group_id=laptop_security_group_id,
                efs_file_system_id=storage.efs_id,
                efs_file_system_arn=storage.efs_arn,
                home_access_point_id=storage.access_point_ids.apply(lambda ids, k=box.home_access_point: ids[k]),
                home_access_point_arn=storage.access_point_arns.apply(lambda arns, k=box.home_access_point: arns[k]),
                ssh_key=box.ssh_key,
                idle_minutes=box.idle_minutes,
                root_volume_gib=box.root_volume_gib,
                client_vpn_endpoint_id=client_vpn_endpoint_id,
                vpn_groups=box.vpn_groups,
            )
        except ValueError as exc:
            raise DlinfraError(str(exc), file=str(ctx.root / "fleet.yaml"), key=key) from None
        boxes[person] = DevBox(f"devbox-{person}", args, opts=pulumi.ResourceOptions(providers=[provider]))
    return boxes
