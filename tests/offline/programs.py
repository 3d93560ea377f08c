"""Small stack programs run under the offline engine, each as a project of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

from dlinfra.model.stackroles import StackRole
from dlinfra.offline import engine, plan_export

ROLE = StackRole("regional", "prod", "us-west-2")


def run_program(tmp_path: Path, body: str, *, exports: dict | None = None) -> plan_export.StackResult:
    """Run a small program as a project of its own (tmp_path, no Pulumi.yaml: default providers allowed)."""
    program = tmp_path / "program.py"
    program.write_text("import pulumi\nimport pulumi_aws as aws\n" + textwrap.dedent(body))
    return engine.run_stack(tmp_path, ROLE, project="t", config={}, stack_exports=exports or {}, program=program)
