"""What an environment's global stack (`<env>-global`) declares: what spans its regions."""

from __future__ import annotations

import itertools

import pulumi

from components.transit_peering import PeerSide, TransitPeering, TransitPeeringArgs
from dlinfra.model import sites
from stacks.context import StackContext, aws_provider, stack_reference


def declare(ctx: StackContext) -> None:
    """Read every regional stack of the environment, peer their transit gateways, export the view."""
    env_name = ctx.role.environment
    env = ctx.fleet.environments[env_name]
    refs = {region: stack_reference(f"regional-{region}", f"{env_name}-{region}") for region in env.regions}
    pulumi.export("environment", env_name)
    pulumi.export("vpc_cidrs", {region: ref.get_output("vpc_cidr") for region, ref in refs.items()})
    pulumi.export("vpc_ids", {region: ref.get_output("vpc_id") for region, ref in refs.items()})

    # This stack has no region of its own: every AWS resource names its region through a provider.
    providers = {region: aws_provider(region) for region in sorted(env.regions)}
    behind: dict[str, dict[str, str]] = {region: {} for region in env.regions}
    for dest in sites.environment_networks(ctx.fleet, ctx.plan, env_name):
        behind[dest.region][dest.key] = str(dest.cidr)

    def side(region: str) -> PeerSide:
        return PeerSide(
            region=region,
            provider=providers[region],
            transit_gateway_id=refs[region].get_output("transit_gateway_id"),
            route_table_id=refs[region].get_output("transit_route_table_id"),
            cidrs=behind[region],
        )

    attachments: dict[str, pulumi.Output[str]] = {}
    # One edge per unordered pair; the lexicographically first region requests, the other accepts.
    for first, second in itertools.combinations(sorted(env.regions), 2):
        peering = TransitPeering(
            f"peering-{first}-{second}",
            TransitPeeringArgs(names=ctx.names, requester=side(first), accepter=side(second)),
        )
        attachments[f"{first}/{second}"] = peering.attachment_id
    pulumi.export("peering_attachment_ids", attachments)
