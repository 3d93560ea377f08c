"""The offline engine: runs the real stack program in-process under Pulumi's mocks and exports the plan.

Each stack runs in a fresh context (Pulumi's settings and config are context variables), in dependency
order, so a global stack's StackReferences resolve to the regional stacks' real offline exports.
The plan export schema is documented in docs/plan-export.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import importlib
import json
import multiprocessing
import runpy
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pulumi import asset as pulumi_asset
from pulumi.runtime import config as pulumi_config
from pulumi.runtime import mocks, rpc, settings, stack
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _sync_await

from dlinfra.errors import DlinfraError
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import quiescence, schema
from dlinfra.offline.cloud import FakeCloud

PLAN_SCHEMA = "dlinfra.plan/v1"
MASK = "[secret]"
ORGANIZATION = "organization"


class EngineError(DlinfraError):
    """The program failed under the offline engine (bad input, unknown key, unknown invoke)."""


@dataclass
class ResourceRecord:
    """One registered resource, as it goes into the plan export."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str | None
    provider: str | None
    dependencies: list[str]
    protect: bool
    retain_on_delete: bool
    delete_before_replace: bool
    replace_on_changes: list[str]
    ignore_changes: list[str]
    aliases: list[str]
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    additional_secret_outputs: list[str]


@dataclass
class StackResult:
    """What one offline stack run produced."""

    role: StackRole
    resources: list[ResourceRecord] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # unmasked, kept in memory only
    secret_outputs: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def masked_outputs(self) -> dict[str, Any]:
        """The stack outputs as the plan export shows them: secrets read "[secret]"."""
        return {k: (MASK if k in self.secret_outputs else _mask(v)) for k, v in sorted(self.outputs.items())}

    def plan(self, project: str) -> dict[str, Any]:
        """The plan export: JSON-ready, secrets masked."""
        by_type: dict[str, int] = {}
        for r in self.resources:
            by_type[r.type] = by_type.get(r.type, 0) + 1
        return {
            "schema": PLAN_SCHEMA,
            "project": project,
            "stack": self.role.name,
            "role": {"kind": self.role.kind, "environment": self.role.environment, "region": self.role.region},
            "resources": [_resource_json(r) for r in sorted(self.resources, key=lambda r: r.urn)],
            "outputs": self.masked_outputs(),
            "summary": {"resources": len(self.resources), "by_type": dict(sorted(by_type.items()))},
        }


def _asset(value: Any) -> Any:
    """An asset or archive as plain data: the file's name and content hash (deterministic across machines)."""
    if isinstance(value, pulumi_asset.FileAsset):
        data = Path(value.path).read_bytes()
        return {"asset": {"file": Path(value.path).name, "sha256": hashlib.sha256(data).hexdigest()}}
    if isinstance(value, pulumi_asset.StringAsset):
        return {"asset": {"sha256": hashlib.sha256(value.text.encode()).hexdigest()}}
    if isinstance(value, pulumi_asset.AssetArchive):
        return {"archive": {name: _asset(item) for name, item in sorted(value.assets.items())}}
    return {"asset": {"kind": type(value).__name__}}


def _mask(value: Any) -> Any:
    """Replace every secret-wrapped value with the mask, and assets with their hashes, at any depth."""
    if schema.is_secret(value):
        return MASK
    if isinstance(value, (pulumi_asset.Asset, pulumi_asset.Archive)):
        return _asset(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def _unwrap(value: Any) -> tuple[Any, bool]:
    """Plain value and whether any part of it was secret."""
    if schema.is_secret(value):
        return _unwrap(value.get("value"))[0], True
    if isinstance(value, dict):
        pairs = {k: _unwrap(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(s for _, s in pairs.values())
    if isinstance(value, list):
        items = [_unwrap(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


def _resource_json(r: ResourceRecord) -> dict[str, Any]:
    secret_out = set(r.additional_secret_outputs)
    return {
        "urn": r.urn,
        "type": r.type,
        "name": r.name,
        "custom": r.custom,
        "id": r.id,
        "parent": r.parent,
        "provider": r.provider,
        "dependencies": sorted(r.dependencies),
        "protect": r.protect,
        "retain_on_delete": r.retain_on_delete,
        "delete_before_replace": r.delete_before_replace,
        "replace_on_changes": r.replace_on_changes,
        "ignore_changes": r.ignore_changes,
        "aliases": r.aliases,
        "inputs": _mask(r.inputs),
        "outputs": {k: (MASK if k in secret_out else _mask(v)) for k, v in sorted(r.outputs.items())},
    }


def disabled_default_providers(root: Path) -> frozenset[str]:
    """Packages whose default providers the project disables (`pulumi:disable-default-providers` in Pulumi.yaml)."""
    path = root / "Pulumi.yaml"
    project = yaml.safe_load(path.read_text()) if path.exists() else {}
    setting = ((project or {}).get("config") or {}).get("pulumi:disable-default-providers")
    value = setting.get("value") if isinstance(setting, dict) else setting
    return frozenset(str(p) for p in value or ())


def _package(token: str) -> str:
    return token.split(":", 1)[0]


class _Monitor(mocks.MockMonitor):
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
                plain, secret = _unwrap(value)
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
    """Placeholder: _Monitor answers registrations and invokes itself, through the FakeCloud."""

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        raise NotImplementedError

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        raise NotImplementedError


def stack_config(root: Path, stack_name: str) -> dict[str, Any]:
    """The `config:` of stacks/Pulumi.<stack>.yaml, flattened to `ns:key` -> value (secure values masked)."""
    path = root / "stacks" / f"Pulumi.{stack_name}.yaml"
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    out: dict[str, Any] = {}
    for key, value in (data.get("config") or {}).items():
        if isinstance(value, dict) and "secure" in value:
            value = "offline-placeholder-secret"  # ciphertext cannot be decrypted without the Pulumi CLI
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out


def run_stack(
    root: Path,
    role: StackRole,
    *,
    project: str,
    config: Mapping[str, str],
    stack_exports: Mapping[str, Mapping[str, Any]],
    program: Path | None = None,
) -> StackResult:
    """Run the stack program for one stack under the fake cloud; EngineError on any failure."""
    result = StackResult(role=role)
    no_defaults = disabled_default_providers(root)
    # With the default AWS provider disabled there is no default region: every AWS resource and invoke must
    # reach the fake cloud through an explicit provider, which names its region.
    cloud = FakeCloud(region=None if "aws" in no_defaults else role.region, stack_exports=stack_exports)
    monitor = _Monitor(cloud, result, no_defaults)
    entry = program or root / "stacks" / "__main__.py"
    started = time.perf_counter()

    def body() -> None:
        cfg = {**stack_config(root, role.name), **config}
        try:
            under_mocks(
                monitor, lambda: _run_program(entry), root=root, project=project, stack_name=role.name, config=cfg
            )
        finally:
            monitor.close()

    try:
        contextvars.Context().run(body)
    except DlinfraError as exc:
        raise EngineError(exc.detail, file=exc.file, key=exc.key) from None
    except Exception as exc:  # noqa: BLE001 - any program failure becomes one clear message
        detail = "; ".join(monitor.errors) or _describe(exc)
        raise EngineError(f"stack {role.name}: {detail}") from None
    result.seconds = time.perf_counter() - started
    return result


def under_mocks(
    monitor: mocks.MockMonitor,
    program: Callable[[], None],
    *,
    root: Path,
    project: str,
    stack_name: str,
    config: Mapping[str, str],
) -> None:
    """Run a Pulumi program as a preview against a mock monitor, in the calling context (give it a fresh one)."""
    settings.configure(
        mocks.MockSettings(
            monitor=monitor,
            monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
            engine=mocks.MockEngine(None),
            project=project,
            stack=stack_name,
            dry_run=True,
            organization=ORGANIZATION,
            root_directory=str(root),
            callbacks=None,
            # MockSettings skips Settings.__init__, so these would fall back to one default shared by every
            # context: a failed run's pending tasks would then leak into the next stack's run.
            outputs=set(),
            lock=threading.Lock(),
            package_refs={},
            base_providers_by_ref={},
        )
    )
    settings.ROOT.set(None)
    pulumi_config.set_all_config(dict(config), [])
    with (
        quiescence.settled_in_batches(),
        quiescence.few_collections(),
        quiescence.without_source_positions(),
        asyncio.Runner() as runner,
    ):
        runner.get_loop().set_exception_handler(_record_loop_error)
        runner.run(stack.run_in_stack(program))


def _record_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Keep the event loop's own error reports quiet: a failed stack is reported once, as an EngineError.

    The default handler also formats a traceback, which on CPython 3.11 calls ast.parse; run from a future's
    finaliser inside another ast.parse, that makes CPython raise "AST constructor recursion depth mismatch".
    """
    del loop, context


def _run_program(entry: Path) -> None:
    runpy.run_path(str(entry), run_name="__main__")


def _describe(exc: BaseException) -> str:
    """The innermost useful message of a program failure (Pulumi wraps errors raised in callbacks)."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    innermost = chain[-1]
    if isinstance(innermost, DlinfraError):
        return str(innermost)
    # The SDK's own type checks say which resource and input they were on in an outer link of the chain.
    context = next((str(e).splitlines()[0] for e in chain if str(e).startswith("While processing resource")), "")
    return "; ".join(p for p in (context, f"{type(innermost).__name__}: {innermost}") if p)


def run_all(
    root: Path,
    roles: Iterable[StackRole],
    *,
    project: str,
    config: Mapping[str, str],
    on_done: Callable[[StackResult], None] | None = None,
    program: Path | None = None,
) -> list[StackResult]:
    """Run stacks in the given (dependency) order, feeding each one's exports to later StackReferences."""
    exports: dict[str, dict[str, Any]] = {}
    results = []
    for role in roles:
        res = run_stack(root, role, project=project, config=config, stack_exports=exports, program=program)
        exports[role.name] = {"outputs": res.outputs, "secret": sorted(res.secret_outputs)}
        results.append(res)
        if on_done:
            on_done(res)
    return results


# The provider SDK packages of the resource types dlinfra declares (every one is in dlinfra/data/replacements.yaml,
# which tests/model/test_replacement.py checks against the code).
_SDK_PACKAGES = {"aws": "pulumi_aws", "kubernetes": "pulumi_kubernetes", "random": "pulumi_random", "tls": "pulumi_tls"}


def sdk_class(token: str) -> type[Any] | None:
    """The provider SDK class that declares a resource type (pulumi_aws.ec2.Vpc for aws:ec2/vpc:Vpc), found through
    the SDK's own resource-module registry; None for a type no installed provider SDK declares."""
    package, module, _ = token.split(":")
    if package not in _SDK_PACKAGES:
        return None
    importlib.import_module(_SDK_PACKAGES[package])  # registers its resource modules
    registered = rpc.get_resource_module(package, module, "")
    if registered is None:
        return None
    info = registered.mod_info  # type: ignore[attr-defined]
    return getattr(importlib.import_module(info["fqn"]), info["classes"][token], None)  # type: ignore[no-any-return]


def preload_sdk_modules() -> list[str]:
    """Import the provider SDK modules that declare dlinfra's resource types; returns their names.

    The provider SDKs import their modules lazily, on first use, and a module such as pulumi_aws.ec2 takes about a
    second: done before forking, the worker processes share it instead of each importing it again. The modules are
    those of the types in the replacement table.
    """
    from dlinfra.model import replacement

    classes = (sdk_class(token) for token in replacement.table().rules)
    return sorted({cls.__module__.rpartition(".")[0] for cls in classes if cls is not None})


def run_parallel(
    root: Path,
    roles: Sequence[StackRole],
    depends_on: Mapping[StackRole, Sequence[StackRole]],
    *,
    project: str,
    config: Mapping[str, str],
    jobs: int,
    on_done: Callable[[StackResult], None] | None = None,
    program: Path | None = None,
) -> list[StackResult]:
    """Run stacks in up to `jobs` processes, each as soon as the stacks it reads are done; same results as run_all.

    Pulumi's mock runtime is per-process state, so a process runs one stack at a time. A stack gets the exports
    of the stacks it depends on only, so a reference the dependencies do not declare fails the same in every
    order. Results are reported in the order of `roles`, whatever order they finish in. When a stack fails, the
    stacks that depend on it are not run, and EngineError names both.
    """
    order = list(roles)
    selected = set(order)
    needs = {role: [d for d in depends_on.get(role, ()) if d in selected] for role in order}
    exports: dict[str, dict[str, Any]] = {}
    done: dict[StackRole, StackResult] = {}
    failed: dict[StackRole, str] = {}
    blocked: dict[StackRole, StackRole] = {}  # stack not run -> the failed stack it (transitively) depends on
    reported = 0
    # fork: the workers start with dlinfra, pulumi and the provider SDK modules the programs use already imported
    # (imported once here, not once per worker), and everything alive frozen out of garbage collection, so the
    # workers neither rescan nor copy it. The parent runs no Pulumi program here, so no mock runtime state or
    # engine thread is copied into them.
    preload_sdk_modules()
    with quiescence.frozen(), futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        running: dict[futures.Future[StackResult], StackRole] = {}
        waiting = list(order)

        def submit_ready() -> None:
            for role in list(waiting):
                cause = next((blocked.get(d, d) for d in needs[role] if d in failed or d in blocked), None)
                if cause is not None:
                    blocked[role] = cause
                    waiting.remove(role)
                elif all(d in done for d in needs[role]):
                    refs = {d.name: exports[d.name] for d in needs[role]}
                    waiting.remove(role)
                    try:
                        job = pool.submit(
                            run_stack,
                            root,
                            role,
                            project=project,
                            config=dict(config),
                            stack_exports=refs,
                            program=program,
                        )
                    except futures.process.BrokenProcessPool as exc:  # a worker died (killed, out of memory)
                        failed[role] = f"stack {role.name}: not run, the worker processes stopped ({exc})"
                        continue
                    running[job] = role

        submit_ready()
        while running:
            finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in sorted(finished, key=lambda f: order.index(running[f])):
                role = running.pop(future)
                try:
                    res = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker's failure (or its death) is that stack's failure
                    message = str(exc) if isinstance(exc, EngineError) else _describe(exc)
                    failed[role] = (
                        message if message.startswith(f"stack {role.name}:") else f"stack {role.name}: {message}"
                    )
                    continue
                exports[role.name] = {"outputs": res.outputs, "secret": sorted(res.secret_outputs)}
                done[role] = res
            submit_ready()
            while reported < len(order) and order[reported] in done.keys() | failed.keys() | blocked.keys():
                if on_done and order[reported] in done:
                    on_done(done[order[reported]])
                reported += 1
    if failed:
        messages = []
        for role, message in failed.items():
            dependents = [r.name for r in order if blocked.get(r) == role]
            if dependents:
                message += f" (not previewed, as they depend on {role.name}: {', '.join(dependents)})"
            messages.append(message)
        raise EngineError("; ".join(messages))
    return [done[role] for role in order]


def manifests(result: StackResult) -> list[dict[str, Any]]:
    """The Kubernetes objects a stack declares as typed resources (not Helm charts), as manifests.

    The engine records kubernetes:* inputs exactly as the provider receives them: camelCase, with apiVersion
    and kind, so they are manifests already. Secrets stay masked.
    """
    out = []
    for r in sorted(result.resources, key=lambda r: r.urn):
        if r.custom and r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:helm.sh/"):
            manifest = _mask(r.inputs)
            if isinstance(manifest, dict) and "kind" in manifest and "apiVersion" in manifest:
                out.append(manifest)
    return out


def write_manifests(result: StackResult, out_dir: Path) -> Path | None:
    """Write build/manifests/<stack>.yaml (one document per object) when the stack declares any."""
    docs = manifests(result)
    if not docs:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.role.name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=True))
    return path


def write_plan(result: StackResult, project: str, out_dir: Path, provenance: Mapping[str, str] | None = None) -> Path:
    """Write build/plans/<stack>.json (sorted keys, stable across runs), with what it was made from."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.role.name}.json"
    data = result.plan(project)
    if provenance is not None:
        data["provenance"] = dict(provenance)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
