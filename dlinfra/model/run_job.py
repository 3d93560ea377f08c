"""`dlinfra run`'s job: where the code goes and the batch/v1 Job that runs a command on it in a standard image, queued
by Kueue in the team's namespace and keeping the checkpoint contract of docs/jobs.md (pure: the fleet and the
request in, a plan and a manifest out).

The pod: an init container fetches the archive from the team's S3 prefix with the AWS CLI, as the namespace's
`default` service account, whose EKS Pod Identity association gives the team's data role (components/platform_aws.py:
read and write under `teams/<team>/` of each data bucket); a second one, in the standard image, unpacks it into an
emptyDir mounted at /workspace and makes the run's directories on the team's EFS claim; TensorBoard runs beside the
command as a native sidecar (an init container with restartPolicy Always, stable since Kubernetes 1.33), bound to
the pod's loopback, so only `kubectl port-forward` (the API server and kubelet, with the caller's own rights) reaches
it; the command runs in /workspace, as given (no shell between it and SIGTERM).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.model import kueue, team_storage
from dlinfra.model.fleet.images import MAX_CODE_LIMIT_MIB, StandardImages
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's label naming a job's LocalQueue
# components/charts/kueue.py LOCAL_QUEUE. Not the team's `overflow` queue: a job that MultiKueue sends to another region
# would fetch its code from this region's bucket and write to this region's EFS, which the worker region's team role
# and claims do not reach.
DEFAULT_QUEUE = "default"
POOL_LABEL = "dlinfra.io/pool"  # the node label a pool's nodes carry and Kueue's flavor selects
RUN_LABEL = "dlinfra.io/run"  # every object of a run, so `kubectl -l dlinfra.io/run=NAME` finds its pods
TEAM_LABEL = "dlinfra.io/team"
GPU_RESOURCE = kueue.GPU_RESOURCE
# NVIDIA's taint on GPU nodes (components/charts/nodes.py GPU_TAINT_KEY: every GPU pool of the reference fleet and every
# site's machines carry nvidia.com/gpu=true:NoSchedule). Kueue gives a job only a flavor whose nodeTaints its pod
# template tolerates (Kueue docs, "Resource Flavor": nodeTaints), so a GPU run tolerates it; the GPU admission policy
# allows exactly this one and refuses the health and burn-in taints (components/charts/gpu_admission.py).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# Never on a site's machines (EKS Hybrid Nodes): the team's EFS claim cannot be mounted there, since EFS mount targets
# admit NFS from the VPC's private subnets only (components/storage.py) and the EFS CSI driver is not among the add-ons
# AWS validates for hybrid nodes (EKS user guide, "Configure add-ons for hybrid nodes"). EKS labels hybrid nodes
# eks.amazonaws.com/compute-type=hybrid and a site's flavor carries that label in its nodeLabels
# (components/charts/kueue.py resource_flavor_spec); Kueue matches a pod template's required node affinity against
# flavors' nodeLabels and does not assign a flavor it excludes (Kueue docs, "Resource Flavor": ResourceFlavor labels).
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"
NOT_HYBRID = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": COMPUTE_TYPE_LABEL, "operator": "NotIn", "values": ["hybrid"]}]}
            ]
        }
    }
}
CODE_BUCKET = "results"  # components/storage.py BUCKETS: the code of a run is kept with what it produced
RUNS_PREFIX = "runs/"  # under the team's prefix: what the team's people may upload to (components/platform_aws.py)
CODE_KEY = team_storage.S3_TEAM_PREFIX + RUNS_PREFIX + "{run}/code.tar.gz"
WORKSPACE = "/workspace"  # where the code is unpacked, and the command's working directory
TEAM_MOUNT = "/team"  # the team's EFS directory (claim team_storage.TEAM_CLAIM)
RUN_DIR = TEAM_MOUNT + "/runs/{run}"  # the run's own directory there: checkpoints/ and tensorboard/
TENSORBOARD_PORT = 6006  # TensorBoard's own default port
BACKOFF_LIMIT = 3  # real failures only: disruptions are ignored by the podFailurePolicy (docs/jobs.md)
FETCH_VOLUME = "6Gi"  # the archive's emptyDir: above the most a run may upload (images.MAX_CODE_LIMIT_MIB)
KUBELET_DEFAULT_GRACE = 30  # terminationGracePeriodSeconds when a pod gives none: where no pool caps it
_NAME_MAX = 52  # a Job's name goes into its pods' names and the batch.kubernetes.io/job-name label (63)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")  # as teams.<team>.role_arn
_SESSION_CHARS = re.compile(r"[^\w+=,.@-]", flags=re.ASCII)
_EKS_ARN = re.compile(r"arn:aws[a-z-]*:eks:([a-z0-9-]+):\d{12}:cluster/([A-Za-z0-9][A-Za-z0-9_-]*)")
_EKS_ENDPOINT = re.compile(r"https://[^/:]+\.([a-z]{2}(?:-[a-z]+)+-\d+)\.eks\.amazonaws\.com(?:\.cn)?(?::443)?")
# A resource quantity as Kubernetes writes one (apimachinery resource.Quantity): a number and an SI or binary suffix.
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


class RunError(DlinfraError):
    """A run the fleet cannot take: no such team, image or pool, a grace above the cap."""


@dataclass(frozen=True)
class RunPlan:
    """Everything a run's Job needs, resolved from the fleet and the options."""

    name: str  # the Job's name
    environment: str
    region: str
    team: str
    namespace: str
    queue: str
    image: str  # standard image reference
    image_name: str
    fetch_image: str
    command: tuple[str, ...]
    gpus: int
    pool: str | None  # pinned pool, or None: any pool Kueue gives
    grace: int  # terminationGracePeriodSeconds
    bucket: str  # the results bucket of the region
    key: str  # the archive's key in it
    cluster: str  # the region's EKS cluster, where the Job must go (components/cluster.py: Names.physical("eks"))
    code_sha256: str = ""
    cpu: str | None = None  # CPU request (Kubernetes quantity), None: none
    memory: str | None = None  # memory request and limit, None: none
    tensorboard: bool = True
    # Taints of the pools Kueue may give it (key, value, effect), from the fleet: tolerated so their flavors fit.
    tolerations: tuple[tuple[str, str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def code_uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def run_dir(self) -> str:
        return RUN_DIR.format(run=self.name)


def default_name(directory: str, now: datetime) -> str:
    """`<directory>-<UTC time>`, made a DNS label: one run of a directory per second gets its own name."""
    stem = re.sub(r"[^a-z0-9-]+", "-", directory.lower()).strip("-")[:30].strip("-") or "run"
    return f"{stem}-{now:%Y%m%d-%H%M%S}"


def _names(fleet: Fleet, env: str, region: str) -> Names:
    return Names(project=fleet.project, environment=env, region=region, fleet_tags=fleet.tags)


def bucket_name(fleet: Fleet, env: str, region: str, account: str) -> str:
    """The region's results bucket (components/storage.py _bucket_name: the account id makes it global)."""
    return f"{_names(fleet, env, region).physical(CODE_BUCKET, max_len=50)}-{account}"


def session_name(user: str) -> str:
    """The STS session name of a run's upload, `dlinfra-run-<user>`, so CloudTrail says who put the code there
    (STS AssumeRole: RoleSessionName is 2 to 64 of letters, digits and +=,.@_-)."""
    return ("dlinfra-run-" + _SESSION_CHARS.sub("-", user))[:64]


def upload_role(fleet: Fleet, team: str, asked: str | None) -> str | None:
    """The IAM role a run uploads as: as asked (--role-arn), else the team's role_arn; None: the caller's own."""
    if asked is not None and not _ROLE_ARN.fullmatch(asked):
        raise RunError(f"--role-arn: {asked!r} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)")
    return asked or fleet.teams[team].role_arn


def check_cluster(run: RunPlan, context: str, cluster: str, server: str) -> str:
    """Refuse a kubeconfig context whose cluster is not the run's (its code went to the run's region); say what was
    checked. `aws eks update-kubeconfig` names a context's cluster by its ARN (arn:aws:eks:<region>:<account>:cluster/
    <name>); other tools keep EKS's endpoint, https://<id>.<zone>.<region>.eks.amazonaws.com."""
    fix = f"aws eks update-kubeconfig --region {run.region} --name {run.cluster}, or give its context with --context"
    arn = _EKS_ARN.fullmatch(cluster)
    if arn is not None:
        region, name = arn.groups()
        if (region, name) != (run.region, run.cluster):
            raise RunError(
                f"--context: {context} is cluster {name} in {region}, but this run goes to {run.cluster} in "
                f"{run.region} ({fix})"
            )
        return f"context {context} (cluster {name} in {region})"
    endpoint = _EKS_ENDPOINT.fullmatch(server.rstrip("/"))
    if endpoint is not None:
        if endpoint.group(1) != run.region:
            raise RunError(
                f"--context: {context} is an EKS cluster in {endpoint.group(1)}, but this run goes to {run.cluster} "
                f"in {run.region} ({fix})"
            )
        return f"context {context} (an EKS cluster in {run.region}: its name is not in the kubeconfig)"
    return f"context {context} ({server}: not an EKS endpoint, its cluster is not checked)"


def _images(fleet: Fleet) -> StandardImages:
    if fleet.standard_images is None:
        raise RunError("the fleet declares no standard_images: ask the lab to add one (docs/researchers.md)")
    return fleet.standard_images


def code_limit_mib(fleet: Fleet, asked: int | None = None) -> int:
    """The cap on a run's code, in MiB: as asked (--max-code-mib), within 1..MAX_CODE_LIMIT_MIB, else the fleet's."""
    if asked is None:
        return _images(fleet).max_code_mib
    if not 1 <= asked <= MAX_CODE_LIMIT_MIB:
        raise RunError(
            f"--max-code-mib: {asked} is outside 1..{MAX_CODE_LIMIT_MIB} (one S3 PutObject takes at most 5 GB, and the "
            "job's archive volume holds 6 GiB)"
        )
    return asked


def region_of(fleet: Fleet, env: str, region: str | None) -> str:
    """The region a run goes to: as asked, else the environment's MultiKueue manager (its primary region)."""
    if env not in fleet.environments:
        raise RunError(f"--env: no environment {env!r} in the fleet ({', '.join(fleet.environments)})")
    regions = fleet.environments[env].regions
    if region is None:
        return fleet.multikueue_manager(env)
    if region not in regions:
        raise RunError(f"--region: environment {env} does not run in {region} ({', '.join(regions)})")
    return region


def _grace(fleet: Fleet, env: str, region: str, pool: str | None, gpus: int, asked: int | None) -> int:
    """The grace the run asks for: what the admission cap allows it (components/charts/checkpoint_grace.py)."""
    pools = fleet.pools_in(env, region)
    if pool is not None:
        cap, why = pools[pool].checkpoint_grace, f"pool {pool}'s checkpoint_grace"
    else:
        kinds = ("gpu",) if gpus else ("gpu", "cpu")
        graces = [p.checkpoint_grace for p in pools.values() if p.kind in kinds]
        if not graces:
            return asked if asked is not None else KUBELET_DEFAULT_GRACE
        cap = min(graces)
        why = f"the smallest {'GPU ' if gpus else ''}pool checkpoint_grace in {env}/{region} (pin a pool with --pool)"
    if asked is None:
        return cap
    if not 1 <= asked <= cap:
        raise RunError(f"--grace: {asked} s is outside 1..{cap} s, {why}")
    return asked


def plan(
    fleet: Fleet,
    *,
    env: str,
    region: str | None,
    team: str | None,
    name: str,
    command: Sequence[str],
    account: str,
    image: str | None = None,
    gpus: int = 1,
    pool: str | None = None,
    grace: int | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    tensorboard: bool = True,
) -> RunPlan:
    """Resolve a run from the fleet: its team's namespace and queue, the image, the grace, where the code goes."""
    images = _images(fleet)
    where = region_of(fleet, env, region)
    if team is None:
        raise RunError("--team: say which team runs it (teams: " + ", ".join(fleet.teams) + ")")
    if team not in fleet.teams:
        raise RunError(f"--team: no team {team!r} in the fleet ({', '.join(fleet.teams) or 'none'})")
    chosen = images.default if image is None else image
    if chosen not in images.images:
        raise RunError(f"--image: no standard image {chosen!r} in the fleet ({', '.join(images.images)})")
    if not command:
        raise RunError("no command: give it after --, e.g. dlinfra run --team vision -- python train.py")
    if gpus < 0:
        raise RunError(f"--gpus: {gpus} is negative")
    if len(name) > _NAME_MAX or not _NAME.fullmatch(name):
        raise RunError(
            f"--name: {name!r} is not a job name: up to {_NAME_MAX} lower-case letters, digits and '-', starting and "
            "ending with a letter or digit"
        )
    for option, value in (("--cpu", cpu), ("--memory", memory)):
        if value is not None and not _QUANTITY.fullmatch(value):
            raise RunError(f"--{option.lstrip('-')}: {value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    pools = fleet.pools_in(env, where)
    if pool is not None:
        if pool not in pools:
            raise RunError(f"--pool: no pool {pool!r} in {env}/{where} ({', '.join(pools) or 'none'})")
        if gpus and pools[pool].kind != "gpu":
            raise RunError(f"--pool: {pool} is a CPU pool; a run with --gpus {gpus} needs a GPU pool")
    candidates = (
        [pools[pool]] if pool is not None else [p for p in pools.values() if p.kind == ("gpu" if gpus else "cpu")]
    )
    taints = sorted({(t.key, t.value, t.effect) for p in candidates for t in p.taints})
    return RunPlan(
        name=name,
        environment=env,
        region=where,
        team=team,
        namespace=fleet.team_namespace(team),
        queue=DEFAULT_QUEUE,
        image=images.images[chosen].image,
        image_name=chosen,
        fetch_image=images.fetch_image,
        command=tuple(command),
        gpus=gpus,
        pool=pool,
        grace=_grace(fleet, env, where, pool, gpus, grace),
        bucket=bucket_name(fleet, env, where, account),
        key=CODE_KEY.format(team=team, run=name),
        cluster=_names(fleet, env, where).physical("eks"),
        cpu=cpu,
        memory=memory,
        tensorboard=tensorboard,
        tolerations=tuple(taints),
    )


_HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _resources(run: RunPlan) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if run.cpu:
        requests["cpu"] = run.cpu
    if run.memory:
        requests["memory"] = limits["memory"] = run.memory
    if run.gpus:
        limits[GPU_RESOURCE] = str(run.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def job(run: RunPlan) -> dict[str, Any]:
    """The batch/v1 Job of a run, as submitted: suspended, Kueue starts it when the team's queue admits it."""
    labels = {QUEUE_LABEL: run.queue, RUN_LABEL: run.name, TEAM_LABEL: run.team}
    env = [
        {"name": "DLINFRA_RUN", "value": run.name},
        {"name": "DLINFRA_CODE", "value": run.code_uri},
        {"name": "DLINFRA_CHECKPOINT_DIR", "value": f"{run.run_dir}/checkpoints"},
        {"name": "DLINFRA_TENSORBOARD_DIR", "value": f"{run.run_dir}/tensorboard"},
        {"name": "DLINFRA_GRACE_SECONDS", "value": str(run.grace)},
        *({"name": k, "value": v} for k, v in run.env),
    ]
    code_volume = {"name": "code", "mountPath": WORKSPACE}
    team_volume = {"name": "team", "mountPath": TEAM_MOUNT}
    archive = "/fetch/code.tar.gz"
    fetch = {
        "name": "fetch-code",
        "image": run.fetch_image,
        "command": ["aws", "s3", "cp", "--region", run.region, "--only-show-errors", run.code_uri, archive],
        "volumeMounts": [{"name": "fetch", "mountPath": "/fetch"}],
        "securityContext": _HARDENED,
    }
    # sha256sum -c refuses an archive other than the one uploaded (the key could be overwritten by the team).
    unpack_script = (
        f'echo "{run.code_sha256}  {archive}" | sha256sum -c --quiet - && '
        f"tar -xzf {archive} --no-same-owner -C {WORKSPACE} && "
        f"mkdir -p {run.run_dir}/checkpoints {run.run_dir}/tensorboard"
    )
    unpack = {
        "name": "unpack-code",
        "image": run.image,
        "command": ["sh", "-c", unpack_script],
        "volumeMounts": [code_volume, {"name": "fetch", "mountPath": "/fetch", "readOnly": True}, team_volume],
        "securityContext": _HARDENED,
    }
    init = [fetch, unpack]
    if run.tensorboard:
        init.append(
            {
                "name": "tensorboard",
                "image": run.image,
                "restartPolicy": "Always",  # a native sidecar: it stops when the command ends
                "command": [
                    "tensorboard",
                    "--logdir",
                    f"{run.run_dir}/tensorboard",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(TENSORBOARD_PORT),
                ],
                "volumeMounts": [{**team_volume, "readOnly": True}],
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                "securityContext": _HARDENED,
            }
        )
    main: dict[str, Any] = {
        "name": "run",
        "image": run.image,
        "command": list(run.command),
        "workingDir": WORKSPACE,
        "env": env,
        "volumeMounts": [code_volume, team_volume],
        "securityContext": _HARDENED,
    }
    resources = _resources(run)
    if resources:
        main["resources"] = resources
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": run.grace,
        "initContainers": init,
        "containers": [main],
        "affinity": copy.deepcopy(NOT_HYBRID),
        "volumes": [
            {"name": "fetch", "emptyDir": {"sizeLimit": FETCH_VOLUME}},
            {"name": "code", "emptyDir": {"sizeLimit": "12Gi"}},
            {"name": "team", "persistentVolumeClaim": {"claimName": team_storage.TEAM_CLAIM}},
        ],
    }
    if run.pool is not None:
        pod["nodeSelector"] = {POOL_LABEL: run.pool}
    tolerations = [GPU_TOLERATION] if run.gpus else []
    tolerations += [
        {"key": key, "operator": "Equal", "value": value, "effect": effect}
        for key, value, effect in run.tolerations
        if not (run.gpus and key == GPU_TOLERATION["key"] and effect == GPU_TOLERATION["effect"])
    ]
    if tolerations:
        pod["tolerations"] = tolerations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": run.name,
            "namespace": run.namespace,
            "labels": labels,
            "annotations": {
                "dlinfra.io/code": run.code_uri,
                "dlinfra.io/code-sha256": run.code_sha256,
                "dlinfra.io/image": f"{run.image_name}={run.image}",
            },
        },
        "spec": {
            "suspend": True,  # Kueue unsuspends it when the queue admits it (its webhook would set it anyway)
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
            },
            "template": {"metadata": {"labels": {RUN_LABEL: run.name, TEAM_LABEL: run.team}}, "spec": pod},
        },
    }
