"""`dlinfra run` against the cloud: act as the team's role, find the account, upload the packed code to the team's S3
prefix, submit the Job.

AWS calls start from AWS's default chain (AWS_PROFILE, SSO, environment) and act as the team's IAM role, the one the
upload right is granted to (components/platform_aws.py): assumed with STS AssumeRole unless the caller's session is
that role already (an IAM Identity Center permission set's role, which only its own sign-in can assume). Kubernetes
calls use the kubeconfig's current context (or --context), checked to be the run's cluster. Each failure is one
DlinfraError naming the call. The code is uploaded before the Job is created, so a Job never points at code that is
not there; a refused Job leaves the archive under the team's prefix, where it stays until someone deletes it (the
results bucket's lifecycle expires only noncurrent versions: components/storage.py), which the error names.
"""

from __future__ import annotations

import json
import os
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


IDENTITY_CENTER_PATH = "/aws-reserved/sso.amazonaws.com/"  # where IAM Identity Center keeps its roles (IAM guide)


def _role_parts(role_arn: str) -> tuple[str, str]:
    """An IAM role ARN's account and name (the part after its path)."""
    account = role_arn.split(":")[4]
    return account, role_arn.split(":", 5)[5].rpartition("/")[2]


def team_credentials(sts: Any, role_arn: str, session_name: str) -> dict[str, str] | None:
    """Temporary credentials of the team's role (boto3.Session keyword arguments), or None when the caller's session is
    that role already. STS names an assumed role's session arn:aws:sts::<account>:assumed-role/<role name>/<session>
    (IAM user guide, "IAM identifiers"), without the role's path."""
    reply = aws_replies.call("GetCallerIdentity", sts.get_caller_identity)
    with aws_replies.reading("GetCallerIdentity"):
        caller = str(reply["Arn"])
        kind, _, rest = caller.split(":", 5)[5].partition("/")
        caller_account = caller.split(":")[4]
    account, name = _role_parts(role_arn)
    if kind == "assumed-role" and caller_account == account and rest.partition("/")[0] == name:
        return None
    if IDENTITY_CENTER_PATH in role_arn:
        raise RunSubmitError(
            f"{role_arn} is an IAM Identity Center role, which only its permission set's sign-in can assume, and you "
            f"are {caller}: sign in with that permission set's profile (AWS_PROFILE) and run again"
        )
    what = f"AssumeRole {role_arn}"
    reply = aws_replies.call(what, lambda: sts.assume_role(RoleArn=role_arn, RoleSessionName=session_name))
    with aws_replies.reading(what):
        credentials = reply["Credentials"]
        return {
            "aws_access_key_id": str(credentials["AccessKeyId"]),
            "aws_secret_access_key": str(credentials["SecretAccessKey"]),
            "aws_session_token": str(credentials["SessionToken"]),
        }


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


@dataclass(frozen=True)
class Target:
    """Where the Job goes: the batch/v1 client of a kubeconfig context, and what the kubeconfig says it is."""

    batch: Any
    server: str  # the API server's URL
    context: str  # the context's name
    cluster: str  # the context's cluster entry (an EKS cluster's ARN when aws eks update-kubeconfig wrote it)


def target(context: str | None) -> Target:
    """The kubeconfig's context (the current one unless named) and its batch/v1 client."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        kube = connect_kube(context)
    except SourceError as exc:
        raise RunSubmitError(f"Kubernetes: {exc}") from None
    try:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        contexts, current = config.list_kube_config_contexts(where)  # type: ignore[no-untyped-call]
        chosen = current if context is None else next(c for c in contexts if c["name"] == context)
        return Target(kube.batch, kube.server, str(chosen["name"]), str(chosen["context"].get("cluster", "")))
    except (ConfigException, OSError, StopIteration, KeyError, TypeError, AttributeError):
        return Target(kube.batch, kube.server, context or "(in-cluster)", "")
