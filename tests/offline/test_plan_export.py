"""The plan export: secrets masked at any depth, typed Kubernetes objects as manifests."""

from __future__ import annotations

import itertools
import json
import textwrap
from dataclasses import replace
from pathlib import Path

from dlinfra.offline import cache, engine, plan_export
from tests import reference
from tests.conftest import ROOT
from tests.offline.programs import ROLE, run_program


def test_secrets_are_masked_everywhere(tmp_path: Path) -> None:
    result = run_program(
        tmp_path,
        """
        key = pulumi.Output.secret("psk.never.in.plain.text")
        aws.ec2.VpnConnection("v", customer_gateway_id="cgw-1", type="ipsec.1", tunnel1_preshared_key=key)
        pulumi.export("psk", key)
        pulumi.export("nested", {"k": key, "open": "visible"})
        """,
    )
    text = json.dumps(result.plan("t"))
    assert "psk.never.in.plain.text" not in text
    assert text.count(plan_export.MASK) >= 3
    assert result.plan("t")["outputs"]["nested"] == plan_export.MASK
    assert result.outputs["psk"] == "psk.never.in.plain.text"  # in memory, for StackReference consumers
    assert result.secret_outputs == {"psk", "nested"}


def test_kubernetes_objects_become_manifests(tmp_path: Path) -> None:
    program = tmp_path / "k8s.py"
    program.write_text(
        textwrap.dedent(
            """
            import pulumi
            import pulumi_kubernetes as k8s
            opts = pulumi.ResourceOptions(provider=k8s.Provider("k", kubeconfig="{}"))
            k8s.core.v1.Namespace("team-a", metadata=k8s.meta.v1.ObjectMetaArgs(name="team-a"), opts=opts)
            k8s.helm.v3.Release("chart", chart="x", version="1.0.0", opts=opts)
            """
        )
    )
    result = engine.run_stack(ROOT, ROLE, project="t", config={}, stack_exports={}, program=program)
    assert plan_export.manifests(result) == [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}]
    path = plan_export.write_manifests(result, tmp_path / "manifests")
    assert path is not None and "kind: Namespace" in path.read_text()


def test_plans_are_written_as_json_dumps_writes_them_whether_run_or_reused(tmp_path: Path) -> None:
    """write_plan composes the file from text kept with the result (and in the plan cache); on the reference fleet's
    plans, with and without provenance, it is byte for byte the json.dumps of the whole plan."""
    store = cache.StackCache(folder=tmp_path / "cache", root=ROOT, common={}, environments={}, dependencies={})
    for fresh in reference.runs().values():
        ran = replace(fresh, text=None)  # the shared run's result, without text made by another test
        store.store(ran.role, "key", ran)
        reused = store.load(ran.role, "key")
        assert reused is not None and reused.text == ran.text is not None  # the entry holds the text
        for result, provenance in itertools.product((ran, reused), (None, reference.provenance())):
            plan = fresh.plan("lab") | ({"provenance": provenance} if provenance else {})
            written = plan_export.write_plan(result, "lab", tmp_path / "plans", provenance).read_bytes()
            assert written == (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode(), result.role.name
