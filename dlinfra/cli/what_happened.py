"""The `what-happened` subcommand: one timeline of a node, instance or pod (docs/what-happened.md).

`register` adds it to dlinfra.cli's parser. Bad input raises DlinfraError (exit 2); so does having nothing at
all to read from (no kubeconfig and no AWS credentials). A source that fails alone is reported and skipped.
A target that no source knows exits 1: nothing found.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dlinfra.cli.common import Handler, out, working
from dlinfra.errors import DlinfraError
from dlinfra.ops import what_happened as wh
from dlinfra.ops import what_happened_sources as sources

DEFAULT_SINCE = "7d"  # long enough for a maintenance notice (usually days ahead) and what followed it


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `what-happened` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "what-happened",
        parents=[common],
        help="one timeline of a node, instance or pod: Kubernetes, EC2, Auto Scaling, the termination queue",
        description="Reads, with your own kubeconfig and AWS credentials, and changes nothing (queue messages "
        "are peeked, never deleted). Example: dlinfra what-happened i-0abc123def4567890 --since 2d "
        "--stack prod-us-west-2",
    )
    cmd.add_argument(
        "target",
        metavar="NODE|INSTANCE-ID|POD",
        help="i-... (instance), node/NAME, NAMESPACE/NAME or pod/NAME (pod); a bare NAME is a node if one has "
        "that name, else a pod in --namespace",
    )
    cmd.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        help="start of the window: a duration back from now (30m, 6h, 2d, 1w) or an ISO time "
        f"(default {DEFAULT_SINCE})",
    )
    cmd.add_argument("--json", action="store_true", help="print JSON (schema dlinfra.what-happened/v1)")
    cmd.add_argument("--region", help="AWS region (default: from the node's zone, else your AWS configuration)")
    cmd.add_argument("--context", help="kubeconfig context (default: the current one)")
    cmd.add_argument("-n", "--namespace", default="default", help="namespace of a pod given as NAME (default: default)")
    queue = cmd.add_mutually_exclusive_group()
    queue.add_argument("--queue-url", help="the termination handler's SQS queue (the regional stack's output)")
    queue.add_argument(
        "--stack",
        help="regional stack <env>-<region>: its termination_queue_url and region outputs are used",
    )
    cmd.add_argument(
        "--outputs", type=Path, help="with --stack: JSON of `pulumi stack output --json` instead of running pulumi"
    )
    return {"what-happened": cmd_what_happened}


def cmd_what_happened(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    target = wh.parse_target(args.target, args.namespace)
    since = wh.parse_since(args.since, now)
    if since >= now:
        raise DlinfraError(f"{args.since!r} is not in the past", key="--since")
    if args.outputs is not None and not args.stack:
        raise DlinfraError("--outputs needs --stack", key="--outputs")
    queue_url, region, groups, problem = _from_stack(args)
    with working(f"reading what happened to {target.label}"):
        timeline = run(
            sources.Request(target=target, since=since, now=now, region=region, queue_url=queue_url, groups=groups),
            context=args.context,
        )
    if problem is not None:
        timeline.unread = [u for u in timeline.unread if u.source != "termination queue"] + [problem]
    if args.json:
        sys.stdout.write(json.dumps(timeline.to_json(), indent=2) + "\n")
    else:
        wh.render_table(timeline, out)
    return 0 if timeline.anything_found else 1


def run(request: sources.Request, *, context: str | None) -> wh.Timeline:
    """Connect with the user's credentials and read; DlinfraError when neither Kubernetes nor AWS can be used."""
    try:
        kube: sources.Kube | sources.SourceError = sources.connect_kube(context)
    except sources.SourceError as exc:
        kube = exc
    import boto3  # only here: the rest of the CLI works without it

    session = boto3.Session()
    if isinstance(kube, sources.SourceError) and session.get_credentials() is None:
        raise DlinfraError(
            f"nothing to read from: Kubernetes: {kube}; AWS: {sources.NO_CREDENTIALS}", key="what-happened"
        )
    return sources.investigate(
        request,
        kube=kube,
        aws=lambda region: sources.connect_aws(region, session),
        default_region=session.region_name,
    )


def _from_stack(args: argparse.Namespace) -> tuple[str | None, str | None, tuple[str, ...], wh.Unread | None]:
    """Queue URL, region and node pool groups: --queue-url and --region, or the regional stack's outputs
    (termination_queue_url, region, node_pools). Outputs that cannot be read are reported like any source."""
    if not args.stack:
        return args.queue_url, args.region, (), None
    from dlinfra.ops.stack_outputs import read_outputs

    try:
        outputs, origin = read_outputs(args.stack, args.outputs)
    except DlinfraError as exc:
        problem = wh.Unread("termination queue", f"no queue URL from stack {args.stack}: {exc}")
        return None, args.region, (), problem
    url = outputs.get("termination_queue_url")
    region = args.region or outputs.get("region")
    pools = outputs.get("node_pools")
    groups = tuple(sorted(v for v in pools.values() if isinstance(v, str))) if isinstance(pools, dict) else ()
    if not isinstance(url, str) or not url:
        return None, region, groups, wh.Unread("termination queue", f"{origin}: no termination_queue_url output")
    return url, region, groups, None
