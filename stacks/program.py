"""Composition: load the stack's context, then declare what its role (regional, in-cluster, global) holds."""

from __future__ import annotations

from pathlib import Path

import pulumi

from dlinfra.errors import DlinfraError
from stacks.context import load_context


def main(root: Path) -> None:
    """Entry point called by stacks/__main__.py."""
    try:
        ctx = load_context(root)
        if ctx.role.kind == "regional":
            from stacks import regional

            regional.declare(ctx)
        elif ctx.role.kind == "k8s":
            from stacks import in_cluster

            in_cluster.declare(ctx)
        else:
            from stacks import global_stack

            global_stack.declare(ctx)
    except DlinfraError as exc:
        # RunError makes the Pulumi CLI print the message alone, without a traceback.
        raise pulumi.RunError(str(exc)) from None
