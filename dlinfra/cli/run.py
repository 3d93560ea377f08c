"""The `run` subcommand: the working directory, packed as its .gitignore files leave it, runs as a queued job in a
standard image (docs/researchers.md). Bad input, a directory over the limit or a refused call exits 2 with one line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dlinfra.cli.common import Handler, load_checked, out
from dlinfra.errors import DlinfraError
from dlinfra.model import code_pack, run_job


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `run` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "run",
        parents=[common],
        help="run the working directory's code as a queued job in a standard image",
        description="Packs the directory (what its .gitignore files leave), uploads it to the team's S3 prefix as the "
        "team's IAM role (assumed from your AWS credentials), and creates a Kueue-queued Job in the team's namespace "
        "with your kubeconfig, after checking that its context is the run's cluster (docs/researchers.md).",
    )
    cmd.add_argument("--env", help="environment (default: the fleet's only one)")
    cmd.add_argument("--region", help="region of the cluster (default: the environment's primary region)")
    cmd.add_argument("--team", help="the team whose namespace, queue and S3 prefix the run uses")
    cmd.add_argument("--image", help="standard image name from the fleet (default: the fleet's default)")
    cmd.add_argument("--gpus", type=int, default=1, help="GPUs for the command (default: 1; 0 for a CPU run)")
    cmd.add_argument("--pool", help="pin a node pool (dlinfra.io/pool); its checkpoint_grace then caps --grace")
    cmd.add_argument("--grace", type=int, help="seconds to checkpoint after SIGTERM (default: the cap that applies)")
    cmd.add_argument("--cpu", help="CPU request, a Kubernetes quantity (e.g. 8)")
    cmd.add_argument("--memory", help="memory request and limit, a Kubernetes quantity (e.g. 64Gi)")
    cmd.add_argument("--name", help="the Job's name (default: <directory>-<UTC time>)")
    # Absolute now: a command without --fleet runs from the fleet's folder (dlinfra.cli.root).
    cmd.add_argument("--dir", type=Path, default=Path.cwd(), help="the code (default: the current directory)")
    cmd.add_argument(
        "--max-code-mib", type=int, help="the most to upload, at most 5120 (default: standard_images.max_code_mib)"
    )
    cmd.add_argument("--account", help="AWS account id of the buckets (default: the environment's, else the role's)")
    cmd.add_argument("--role-arn", help="IAM role to upload as (default: the team's teams.<team>.role_arn)")
    cmd.add_argument("--context", help="kubeconfig context (default: the current one)")
    cmd.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard sidecar")
    cmd.add_argument("--dry-run", action="store_true", help="print the Job as JSON; upload and submit nothing")
    cmd.add_argument("--list-images", action="store_true", help="print the fleet's standard images and exit")
    cmd.add_argument("run_command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="what to run, after --")
    return {"run": cmd_run}


def _list_images(args: argparse.Namespace) -> int:
    images = load_checked(args).fleet.standard_images
    if images is None:
        raise DlinfraError("the fleet declares no standard_images")
    for name, image in images.images.items():
        default = " (default)" if name == images.default else ""
        out.print(f"{name}{default}: {image.image}" + (f" - {image.notes}" if image.notes else ""), markup=False)
    return 0


def _aws_session(role_arn: str | None) -> Any:
    """A boto3 session acting as the team's role (None: the caller's own credentials), named for the person."""
    import getpass

    import boto3  # only here: the rest of the CLI works without it

    from dlinfra.ops import run as ops_run

    session = boto3.Session()
    if role_arn is None:
        return session
    credentials = ops_run.team_credentials(session.client("sts"), role_arn, run_job.session_name(getpass.getuser()))
    return session if credentials is None else boto3.Session(**credentials)


def cmd_run(args: argparse.Namespace) -> int:
    if args.list_images:
        return _list_images(args)
    loaded = load_checked(args)
    fleet = loaded.fleet
    command = args.run_command[1:] if args.run_command[:1] == ["--"] else args.run_command
    env = args.env
    if env is None:
        if len(fleet.environments) != 1:
            raise run_job.RunError(f"--env: say which environment ({', '.join(fleet.environments)})")
        env = next(iter(fleet.environments))
    run_job.region_of(fleet, env, args.region)  # a wrong --env or --region before any call
    directory = args.dir.resolve()
    name = args.name or run_job.default_name(directory.name, datetime.now(UTC))
    request = {
        "env": env, "region": args.region, "team": args.team, "name": name, "command": command,
        "image": args.image, "gpus": args.gpus, "pool": args.pool, "grace": args.grace,
        "cpu": args.cpu, "memory": args.memory, "tensorboard": not args.no_tensorboard,
    }  # fmt: skip
    run_job.plan(fleet, account="000000000000", **request)  # every option checked before anything is read or sent
    packed = code_pack.pack(directory, run_job.code_limit_mib(fleet, args.max_code_mib))
    known = args.account or fleet.environments[env].account
    size = f"{packed.files} files, {packed.size / code_pack.MIB:.1f} MiB"
    if args.dry_run:  # calls nothing: without a known account, the bucket's name shows where the code would go
        run = replace(run_job.plan(fleet, account=known or "ACCOUNT", **request), code_sha256=packed.sha256)
        sys.stdout.write(json.dumps(run_job.job(run), indent=2) + "\n")
        out.print(f"dry run: {size} would go to {run.code_uri}; nothing uploaded or submitted", markup=False)
        return 0
    from dlinfra.ops import run as ops_run

    session = _aws_session(run_job.upload_role(fleet, args.team, args.role_arn))
    account = known or ops_run.account_id(session.client("sts"))
    run = replace(run_job.plan(fleet, account=account, **request), code_sha256=packed.sha256)
    manifest = run_job.job(run)
    kube = ops_run.target(args.context)  # a missing kubeconfig, or another cluster's context, before the upload
    out.print(f"kubeconfig: {run_job.check_cluster(run, kube.context, kube.cluster, kube.server)}", markup=False)
    ops_run.upload(session.client("s3", region_name=run.region), run, packed)
    out.print(f"uploaded {size} (sha256 {packed.sha256[:12]}) to {run.code_uri}", markup=False)
    job = ops_run.submit(kube.batch, kube.server, manifest, run.code_uri)
    _follow(run, job.uid)
    return 0


def _follow(run: run_job.RunPlan, uid: str) -> None:
    """The job's name and the commands that follow it, each copy-pasteable."""
    ns, name = run.namespace, run.name
    gpus = f"{run.gpus} GPU{'s' if run.gpus != 1 else ''}"
    pods = f"kubectl -n {ns} get pods -l {run_job.RUN_LABEL}={name}"
    lines = [
        f"submitted job {ns}/{name} to queue {run.queue} in {run.environment}/{run.region} "
        f"(image {run.image_name}, {gpus}, grace {run.grace} s)",
        "follow it:",
        f"  kubectl -n {ns} get workloads -l kueue.x-k8s.io/job-uid={uid}   # queued or admitted, and why",
        f"  {pods}",
        # The Job is suspended until Kueue admits it, and has no pod until then: `kubectl logs` would give up. Its
        # status.ready counts pods whose containers all started (Kubernetes docs, "Jobs": Job status), so the wait
        # ends once the command runs, after the image pull and the code's fetch.
        f"  kubectl -n {ns} wait --for=jsonpath='{{.status.ready}}'=1 job/{name} --timeout=24h   # until it runs",
        f"  kubectl -n {ns} logs -f job/{name} -c run",
        f"  kubectl -n {ns} get events --field-selector involvedObject.name=POD   # why a pod stopped or failed",
        f"checkpoints and TensorBoard logs: {run.run_dir} on the team's EFS claim "
        "($DLINFRA_CHECKPOINT_DIR, $DLINFRA_TENSORBOARD_DIR)",
    ]
    if run.tensorboard:
        lines += [
            "TensorBoard, over the laptop VPN, while it runs (then open http://localhost:6006):",
            f'  kubectl -n {ns} port-forward "$({pods} --field-selector=status.phase=Running -o name | head -n 1)" '
            f"{run_job.TENSORBOARD_PORT}:{run_job.TENSORBOARD_PORT}",
        ]
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
