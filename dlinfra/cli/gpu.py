"""`dlinfra gpu expect`: what a GPU node of a pool, a site or an instance type must show, as the JSON the GPU health
check reads on the machine (chef/cookbooks/dlinfra_gpu/files/gpu_check.py; dlinfra.model.gpu_health writes it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from dlinfra.cli.common import Handler, load_checked, out
from dlinfra.errors import DlinfraError, FleetError
from dlinfra.model import gpu_health
from dlinfra.model.fleet.pools import GpuCheck
from dlinfra.ops import gpu_status

STATUS_SCHEMA = "dlinfra.gpu-status/v1"  # `gpu status --json` (docs/json.md)
LABELS_SCHEMA = "dlinfra.gpu-labels/v1"  # `gpu labels --json`


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `gpu expect` to the CLI; returns command name -> handler."""
    gpu = subparsers.add_parser("gpu", help="GPU node health: what the check expects, and what it found")
    gpu_sub = gpu.add_subparsers(dest="gpu_command", required=True, metavar="{expect,status,labels,check}")
    status = gpu_sub.add_parser(
        "status",
        help="every GPU node's health as its burn-in left it (cloud and site), from the cluster (docs/gpu-health.md)",
    )
    status.add_argument("--context", help="kubeconfig context (default: the current one)")
    status.add_argument(
        "--json", action="store_true", help=f"print {{schema: {STATUS_SCHEMA}, nodes: [...]}}, one object per node"
    )
    labels = gpu_sub.add_parser(
        "labels",
        help="unfinished pods and Jobs that select a short model name in nvidia.com/gpu.product, which the move to "
        "NVIDIA's product names would strand (gpu_product_label; docs/gpu-health.md); exit 1 while there are any",
    )
    labels.add_argument("--context", help="kubeconfig context (default: the current one)")
    labels.add_argument(
        "--json",
        action="store_true",
        help=f"print {{schema: {LABELS_SCHEMA}, selections: [...]}}, one object per selection",
    )
    check = gpu_sub.add_parser(
        "check",
        help="run a GPU node's check again now, through SSM (on a drained node: it loads every GPU)",
    )
    check.add_argument("node", help="the node's name (kubectl get nodes)")
    check.add_argument("--context", help="kubeconfig context (default: the current one)")
    check.add_argument("--region", help="a site machine's home region (EC2 nodes: from their providerID)")
    check.add_argument("--force", action="store_true", help="even while pods that use GPUs are on the node")
    expect = gpu_sub.add_parser(
        "expect",
        parents=[common],
        help="write the health check's expectation for a pool's, a site's or an instance type's GPU nodes",
    )
    which = expect.add_mutually_exclusive_group(required=True)
    which.add_argument("--pool", help="a GPU pool of the fleet (with --env and --region)")
    which.add_argument("--site", help="a site of the fleet: its machines' GPUs")
    which.add_argument("--instance-type", help="an EC2 instance type of dlinfra/data/instance_types.yaml")
    expect.add_argument("--env", help="with --pool: the environment")
    expect.add_argument(
        "--region", help="with --pool: the region (one expectation per instance type the pool launches there)"
    )
    expect.add_argument("--efa", action="store_true", help="with --instance-type: expect its EFA devices")
    expect.add_argument(
        "--dcgm-level",
        type=int,
        choices=gpu_health.DCGM_LEVELS,
        help="DCGM diagnostic level, 0 for none (default: the pool's or site's gpu_check; 0 for an instance type)",
    )
    expect.add_argument(
        "--no-throughput", action="store_true", help="do not judge the throughput floors (no PyTorch on the machine)"
    )
    expect.add_argument("--out", type=Path, metavar="FILE", help="write the JSON here (default: print it)")
    return {"gpu": cmd_gpu}


def cmd_gpu(args: argparse.Namespace) -> int:
    if args.gpu_command == "status":
        return _status(args)
    if args.gpu_command == "check":
        return _run_check(args)
    if args.gpu_command == "labels":
        return _labels(args)
    expectation = _expectation(args)
    text = json.dumps(expectation, indent=2) + "\n"
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    else:
        out.print(text, end="", markup=False)
    return 0


def _status(args: argparse.Namespace) -> int:
    """Exit 0 when every GPU node is healthy, 1 when one has failed or is not judged (so scripts can act), 2 on an
    error."""
    from dlinfra.ops import what_happened_sources as sources

    try:
        nodes = sources.connect_kube(args.context).nodes()
    except sources.SourceError as exc:
        raise DlinfraError(f"cannot read the cluster's nodes: {exc}", key="gpu status") from None
    found = gpu_status.gpu_nodes(nodes)
    if args.json:
        document = {"schema": STATUS_SCHEMA, "nodes": [h.to_json() for h in found]}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif not found:
        out.print("no GPU nodes in this cluster", markup=False)
    else:
        table = Table(box=None, pad_edge=False)
        for column in ("NODE", "WHERE", "GPUS", "STATE", "REASON", "SINCE", "LAST CHECK"):
            table.add_column(column, overflow="fold")
        for h in found:
            table.add_row(h.node, h.where, f"{h.gpus} {h.gpu_model}", h.state, h.reason, h.since, h.last_check)
        out.print(table)
        for h in found:
            if h.state not in ("healthy", "burning in") and h.message:
                out.print(f"{h.node}: {h.message}", markup=False)
    return 1 if any(h.state in ("failed", "not judged") for h in found) else 0


def _labels(args: argparse.Namespace) -> int:
    """Exit 1 when something unfinished selects a short name in NVIDIA's product label (the move to NVIDIA's names
    would strand it), else 0; selections of a value no node carries now are listed as notes."""
    from dlinfra.ops import what_happened_sources as sources

    try:
        kube = sources.connect_kube(args.context)
        found = gpu_status.label_selections(kube.nodes(), kube.unfinished_pods(), kube.jobs())
    except sources.SourceError as exc:
        raise DlinfraError(f"cannot read the cluster's nodes, pods and Jobs: {exc}", key="gpu labels") from None
    blocking = any(f.blocking for f in found)
    if args.json:
        document = {"schema": LABELS_SCHEMA, "selections": [f.to_json() for f in found]}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return 1 if blocking else 0
    for f in found:
        note = "" if f.blocking else "note: "
        line = f"{note}{f.kind} {f.namespace}/{f.name}: {f.key} in ({', '.join(f.values)}): {f.problem}"
        out.print(line, markup=False)
    if not blocking:
        out.print("no unfinished pod or Job selects a short model name in nvidia.com/gpu.product", markup=False)
    return 1 if blocking else 0


def _run_check(args: argparse.Namespace) -> int:
    """Start the node's check through SSM Run Command; the burn-in agent then reads its new report."""
    from dlinfra.ops import what_happened_sources as sources

    try:
        kube = sources.connect_kube(args.context)
        node = kube.node(args.node)
        pods = kube.pods_on(args.node) if node is not None else []
    except sources.SourceError as exc:
        raise DlinfraError(f"cannot read node {args.node}: {exc}", key="gpu check") from None
    if node is None:
        raise DlinfraError(f"no node {args.node} in this cluster", key="gpu check")
    target = gpu_status.check_target(node)
    busy = gpu_status.busy_with_gpus(pods)
    if busy and not args.force:
        raise DlinfraError(
            f"node {args.node} runs pods that use its GPUs ({', '.join(busy)}): the check would load every GPU under "
            f"them. Drain it first (kubectl drain {args.node} --ignore-daemonsets), or pass --force",
            key="gpu check",
        )
    region = target.region or args.region
    if region is None:
        raise DlinfraError(f"node {args.node} is a site machine: give its home region with --region", key="--region")
    import boto3  # only here: the rest of the CLI works without it

    command = gpu_status.send_check(boto3.client("ssm", region_name=region), target)
    out.print(
        f"started the GPU check on {args.node} ({target.instance}, {region}): SSM command {command}\n"
        f"follow it: aws ssm get-command-invocation --region {region} --command-id {command} "
        f"--instance-id {target.instance}; then dlinfra gpu status",
        markup=False,
    )
    return 0


def _expectation(args: argparse.Namespace) -> dict[str, Any]:
    if args.instance_type:
        return gpu_health.instance_expectation(
            args.instance_type, efa=args.efa, dcgm_level=args.dcgm_level or 0, throughput=not args.no_throughput
        )
    fleet = load_checked(args).fleet
    if args.site:
        site = fleet.sites.get(args.site)
        if site is None:
            raise FleetError(f"{args.fleet}: sites.{args.site}: no such site (known: {', '.join(sorted(fleet.sites))})")
        if not site.gpu_nodes or not site.gpus_per_node:
            raise FleetError(f"{args.fleet}: sites.{args.site}: the site declares no GPU machines")
        check = _check(site.gpu_check, args)
        product = gpu_health.site_product(site.gpu_model, site.gpu_product)
        return gpu_health.site_expectation(site.gpu_model, product, site.gpus_per_node, check)
    if not args.env or not args.region:
        raise FleetError("--pool needs --env and --region")
    key = f"environments.{args.env}.node_pools.{args.pool}"
    env = fleet.environments.get(args.env)
    pool = env.node_pools.get(args.pool) if env else None
    if pool is None or pool.kind != "gpu":
        raise FleetError(f"{args.fleet}: {key}: no such GPU pool")
    if args.pool not in fleet.pools_in(args.env, args.region):
        raise FleetError(f"{args.fleet}: {key}.regions: the pool does not run in {args.region}")
    check = _check(pool.burn_in, args)
    types = fleet.pool_types(args.env, args.region, args.pool)
    return gpu_health.pool_expectations(types, efa=pool.efa, check=check, sharing=pool.gpu_sharing)


def _check(declared: GpuCheck, args: argparse.Namespace) -> GpuCheck:
    """The burn-in the fleet declares, with what the command line overrides."""
    changes: dict[str, Any] = {}
    if args.dcgm_level is not None:
        changes["dcgm_level"] = args.dcgm_level
    if args.no_throughput:
        changes["throughput"] = False
    return declared.model_copy(update=changes)
