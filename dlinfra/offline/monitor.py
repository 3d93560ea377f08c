"""The mock monitor of an offline run: answers registrations and invokes from the fake cloud, and records them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pulumi.runtime import mocks, rpc
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _sync_await

from dlinfra.offline import schema
from dlinfra.offline.cloud import FakeCloud
from dlinfra.offline.plan_export import ResourceRecord, StackResult, unwrap


def _package(token: str) -> str:
    return token.split(":", 1)[0]


class RecordingMonitor(mocks.MockMonitor):
    """The mock monitor, extended to record every registration's options and the stack's outputs."""

    def __init__(
        self, cloud: FakeCloud, result: StackResult, no_default_providers: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(mocks=_NoMocks())
        self.cloud = cloud
        self.result = result
        self.no_default_providers = no_default_providers
        self.stack_urn: str | None = None
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.thread_loops: list[asyncio.AbstractEventLoop] = []

    def _ensure_event_loop(self) -> None:
        """Deserialising resource references needs an event loop on the executor thread serving the call.

        The loops made here are remembered and closed after the run, rather than left to the garbage
        collector, whose late close of an abandoned loop fails on its already-released self-pipe.
        """
        try:
            asyncio.get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            with self.lock:
                self.thread_loops.append(loop)

    def close(self) -> None:
        """Close the event loops made for executor threads."""
        with self.lock:
            loops, self.thread_loops = self.thread_loops, []
        for loop in loops:
            if not loop.is_closed():
                loop.close()

    def _require_provider(self, what: str, token: str, provider: str) -> None:
        """Fail as the Pulumi engine does when a package's default provider is disabled and none was given."""
        package = _package(token)
        if provider or package not in self.no_default_providers:
            return
        message = (
            f"{what} has no explicit provider, and default {package} providers are disabled "
            "(Pulumi.yaml pulumi:disable-default-providers); pass the stack's provider"
        )
        with self.lock:
            self.errors.append(message)
        raise schema.InputError(message)

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            self.stack_urn = urn
            return resource_pb2.RegisterResourceResponse(urn=urn)
        self._ensure_event_loop()
        inputs = rpc.deserialize_properties(request.object)
        if request.custom:
            self._require_provider(f"{request.name}: {request.type}", request.type, request.provider)
        try:
            rid, state = self.cloud.new_resource(
                request.type, request.name, urn, inputs, request.provider or None, bool(request.custom)
            )
        except schema.InputError as exc:
            with self.lock:
                self.errors.append(f"{request.name}: {exc}")
            raise
        # What the cloud computed: new keys, and inputs it returns enriched (EKS's vpcConfig gains the cluster group).
        computed = {
            k: v
            for k, v in state.items()
            if k not in inputs or state[k] != inputs[k] or request.type == "pulumi:pulumi:StackReference"
        }
        record = ResourceRecord(
            urn=urn,
            type=request.type,
            name=request.name,
            custom=bool(request.custom),
            parent=request.parent or None,
            provider=request.provider or None,
            dependencies=list(request.dependencies),
            protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete),
            delete_before_replace=bool(request.deleteBeforeReplace),
            replace_on_changes=list(request.replaceOnChanges),
            ignore_changes=list(request.ignoreChanges),
            aliases=[_alias(a) for a in request.aliases] + list(request.aliasURNs),
            id=rid,
            inputs=inputs,
            outputs=computed,
            additional_secret_outputs=list(request.additionalSecretOutputs),
        )
        with self.lock:
            self.result.resources.append(record)
        obj = _sync_await(rpc.serialize_properties(state, {}))
        self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, rid, state)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=rid, object=obj)

    def ReadResource(self, request: Any) -> Any:  # noqa: N802
        """Reads (StackReference is one) answer from the fake cloud like registrations."""
        self._ensure_event_loop()
        urn = self.make_urn(request.parent, request.type, request.name)
        state = rpc.deserialize_properties(request.properties)
        try:
            rid, outputs = self.cloud.new_resource(
                request.type, request.name, urn, state, request.provider or None, True
            )
        except schema.InputError as exc:
            with self.lock:
                self.errors.append(f"{request.name}: {exc}")
            raise
        with self.lock:
            self.result.resources.append(
                ResourceRecord(
                    urn=urn,
                    type=request.type,
                    name=request.name,
                    custom=True,
                    parent=request.parent or None,
                    provider=request.provider or None,
                    dependencies=list(request.dependencies),
                    protect=False,
                    retain_on_delete=False,
                    delete_before_replace=False,
                    replace_on_changes=[],
                    ignore_changes=[],
                    aliases=[],
                    id=rid,
                    inputs=state,
                    outputs={"outputs": "(read from the referenced stack)"},
                    additional_secret_outputs=list(request.additionalSecretOutputs),
                )
            )
        self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, rid, outputs)
        obj = _sync_await(rpc.serialize_properties(outputs, {}))
        return resource_pb2.ReadResourceResponse(urn=urn, properties=obj)

    def Invoke(self, request: Any) -> Any:  # noqa: N802
        self._ensure_event_loop()
        args = rpc.deserialize_properties(request.args)
        if request.tok == "pulumi:pulumi:getResource":
            return super().Invoke(request)
        self._require_provider(f"invoke {request.tok}", request.tok, request.provider)
        try:
            ret = self.cloud.call(request.tok, args, request.provider or None)
        except schema.InputError as exc:
            with self.lock:
                self.errors.append(str(exc))
            raise
        proto = _sync_await(rpc.serialize_properties(ret, {}))
        return resource_pb2.ResourceInvokeResponse(failures=None, **{"return": proto})

    def RegisterResourceOutputs(self, request: Any) -> Any:  # noqa: N802
        if request.urn == self.stack_urn:
            outputs = rpc.deserialize_properties(request.outputs)
            for key, value in outputs.items():
                plain, secret = unwrap(value)
                self.result.outputs[key] = plain
                if secret:
                    self.result.secret_outputs.add(key)
        return super().RegisterResourceOutputs(request)


def _alias(alias: Any) -> str:
    """An alias as text: its URN, or the parts of its spec that are set."""
    if alias.urn:
        return str(alias.urn)
    spec = alias.spec
    parts = {"name": spec.name, "type": spec.type, "stack": spec.stack, "project": spec.project}
    # `dlinfra diff` rebuilds the old URN from these, so "no parent" (Alias(parent=None)) must survive a name or type.
    if spec.noParent:
        parts["noParent"] = "true"
    elif spec.parentUrn:
        parts["parent"] = spec.parentUrn
    return ",".join(f"{k}={v}" for k, v in parts.items() if v)


class _NoMocks(mocks.Mocks):
    """Placeholder: RecordingMonitor answers registrations and invokes itself, through the FakeCloud."""

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        raise NotImplementedError

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        raise NotImplementedError
