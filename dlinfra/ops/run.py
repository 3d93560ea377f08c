"""`dlinfra run` against the cloud: find the account, upload the packed code to the team's S3 prefix, submit the Job.

With the caller's own credentials: AWS's default chain (AWS_PROFILE, SSO, environment) for S3 and STS, and the
kubeconfig's current context (or --context) for Kubernetes. Each failure is one DlinfraError naming the call.
The code is uploaded before the Job is created, so a Job never points at code that is not there; a refused Job
leaves the archive under the team's prefix (the results bucket's lifecycle ages it out), which the error names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.model.code_pack import Packed
from dlinfra.model.run_job import RunPlan
from dlinfra.ops import aws as aws_replies
from dlinfra.ops.what_happened_sources import SourceError, connect_kube

K8S_TIMEOUT = 30  # seconds for the create request


class RunSubmitError(DlinfraError):
    """The code could not be uploaded, or the Job was refused."""


def account_id(sts: Any) -> str:
    """The AWS account of the caller's credentials: the buckets' names carry it."""
    reply = aws_replies.call("GetCallerIdentity", sts.get_caller_identity)
    with aws_replies.reading("GetCallerIdentity"):
        account = str(reply["Account"])
    return account


def upload(s3: Any, run: RunPlan, packed: Packed) -> None:
    """Put the archive at the run's key, never over another's: a run's Job checks its code's sha256 at every start
    (a requeue too), so code replaced under a run would stop it. If-None-Match: * makes S3 refuse an existing key (S3
    user guide, "How to prevent object overwrites with conditional writes": s3:PutObject is all it needs), and
    ChecksumSHA256 has S3 check the bytes it received."""
    import base64

    from botocore.exceptions import ClientError

    what = f"PutObject {run.code_uri}"
    try:
        aws_replies.call(
            what,
            lambda: s3.put_object(
                Bucket=run.bucket,
                Key=run.key,
                Body=packed.data,
                ContentType="application/gzip",
                ChecksumSHA256=base64.b64encode(bytes.fromhex(packed.sha256)).decode(),
                IfNoneMatch="*",
                Metadata={"dlinfra-run": run.name, "sha256": packed.sha256},
            ),
        )
    except aws_replies.AwsError as exc:
        cause = exc.__context__
        if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") == "PreconditionFailed":
            raise RunSubmitError(
                f"{what}: a run named {run.name} already has its code there; give this one another --name"
            ) from None
        raise


@dataclass(frozen=True)
class Submitted:
    """The Job as the API server stored it."""

    name: str
    namespace: str
    uid: str


def _message(body: Any) -> str:
    try:
        reply = json.loads(body)
    except (TypeError, ValueError):
        return str(body).strip().splitlines()[0] if body else ""
    return str(reply.get("message", "")) if isinstance(reply, Mapping) else str(reply)


def submit(batch: Any, server: str, manifest: Mapping[str, Any], code_uri: str) -> Submitted:
    """Create the Job; a refusal (admission policy, quota of objects, no rights, name taken) is one line."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    meta = manifest["metadata"]
    what = f"create Job {meta['namespace']}/{meta['name']}"
    try:
        reply = batch.create_namespaced_job(
            meta["namespace"], manifest, _preload_content=False, _request_timeout=K8S_TIMEOUT
        )
    except ApiException as exc:
        raise RunSubmitError(
            f"{what}: {exc.status} {exc.reason}: {_message(exc.body)} (the code stays at {code_uri})"
        ) from None
    except HTTPError as exc:
        raise RunSubmitError(f"{what}: cannot reach {server} ({type(exc).__name__}: {exc})") from None
    try:
        stored = json.loads(reply.data)
        return Submitted(stored["metadata"]["name"], stored["metadata"]["namespace"], stored["metadata"]["uid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RunSubmitError(f"{what}: unexpected reply from {server}: {exc}") from None


def batch_api(context: str | None) -> tuple[Any, str]:
    """The batch/v1 client of the kubeconfig's context, and the server it talks to."""
    try:
        kube = connect_kube(context)
    except SourceError as exc:
        raise RunSubmitError(f"Kubernetes: {exc}") from None
    return kube.batch, kube.server
