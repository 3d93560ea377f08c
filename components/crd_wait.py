"""CrdWait: a resource that is created once named CustomResourceDefinitions are Established in a cluster.

For custom objects whose CRDs neither a chart nor this program installs, but an operator registers when it starts.
Cilium 1.18's chart ships no CRDs (no crds/ folder, no CRD template; `operator.skipCRDCreation` defaults to false);
its operator creates them only once elected leader (operator/cmd/root.go: the CRD registration cell runs under the
leader lifecycle), while its readiness probe, /healthz, answers as soon as the API server does. So Helm's wait on
the release can finish before the CRDs exist, and the Kubernetes provider gives up on a missing kind after a few
quick retries (pulumi/pulumi-kubernetes issue 1446). Objects that depend on a CrdWait are created after it.

A Pulumi dynamic resource: its provider runs in the deployment (never in a preview, which calls no create) and
reads the cluster with the kubernetes client through the same kubeconfig the stack's Kubernetes provider uses.
Pulumi pickles the provider by reference (`components.crd_wait.CrdWaitProvider`: pulumi/dynamic/dynamic.py
serialize_provider, dill) and unpickles it in `python -m pulumi.dynamic`, started from the project's venv in stacks/
(Pulumi.yaml main), where the project root is not on sys.path: every venv that runs pulumi has the project installed
(`pip install --no-deps -e .`: .ci/setup and the workflows; tests/test_workflows.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pulumi
import pulumi.dynamic

WAIT_SECONDS = 600  # leader election (a 15 s lease by default) and CRD registration take well under this
POLL_SECONDS = 5.0

ReadCrd = Callable[[str], Mapping[str, Any] | None]  # a CRD by name as a dict; None when it does not exist


def established(crd: Mapping[str, Any] | None) -> bool:
    """Does the API server serve this CRD? (its Established condition is True: Kubernetes API reference,
    CustomResourceDefinitionStatus)"""
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def wait_established(
    read: ReadCrd,
    names: Sequence[str],
    *,
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every named CRD is Established; TimeoutError naming the missing ones after `timeout_s`
    (default WAIT_SECONDS), reading them every POLL_SECONDS."""
    timeout_s = WAIT_SECONDS if timeout_s is None else timeout_s
    deadline = clock() + timeout_s
    while True:
        waiting = [name for name in names if not established(read(name))]
        if not waiting:
            return
        if clock() >= deadline:
            raise TimeoutError(
                f"CustomResourceDefinitions not established after {timeout_s:.0f}s: {', '.join(waiting)} "
                "(does their operator run, and has it been elected leader?)"
            )
        sleep(POLL_SECONDS)


def _reader(kubeconfig: str) -> ReadCrd:
    from kubernetes import client, config

    # The kubernetes client carries no type annotations.
    api = client.ApiextensionsV1Api(config.new_client_from_config_dict(json.loads(kubeconfig)))  # type: ignore[no-untyped-call]

    def read(name: str) -> Mapping[str, Any] | None:
        try:
            crd: Mapping[str, Any] = api.read_custom_resource_definition(name).to_dict()
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return crd

    return read


class CrdWaitProvider(pulumi.dynamic.ResourceProvider):
    """Creates (and, when the list changes, updates) by waiting for the CRDs; deletes nothing."""

    # How the provider waits; tests replace them.
    clock: Callable[[], float] = staticmethod(time.monotonic)
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def create(self, props: Any) -> pulumi.dynamic.CreateResult:
        crds = list(props["crds"])
        wait_established(_reader(str(props["kubeconfig"])), crds, clock=self.clock, sleep=self.sleep)
        return pulumi.dynamic.CreateResult(id_=hashlib.sha256(",".join(crds).encode()).hexdigest()[:16], outs=props)

    def update(self, _id: str, _olds: Any, news: Any) -> pulumi.dynamic.UpdateResult:
        wait_established(_reader(str(news["kubeconfig"])), list(news["crds"]), clock=self.clock, sleep=self.sleep)
        return pulumi.dynamic.UpdateResult(outs=news)


class CrdWait(pulumi.dynamic.Resource):
    """Exists once every CRD in `crds` is Established in the cluster `kubeconfig` reaches."""

    crds: pulumi.Output[list[str]]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[str],  # the stack's kubeconfig (exec authentication: no credentials in it)
        crds: Sequence[str],  # CRD names, <plural>.<group>
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        if not crds or len(set(crds)) != len(crds):
            raise ValueError(f"crds: name each CRD once, got {list(crds)}")
        super().__init__(CrdWaitProvider(), name, {"kubeconfig": kubeconfig, "crds": list(crds)}, opts)
