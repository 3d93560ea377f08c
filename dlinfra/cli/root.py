"""The lab's folder found from a subdirectory, as git finds its work tree.

Without --fleet, a command looks for fleet.yaml in the current directory and then in each parent, stopping at the
filesystem root or at a directory that holds .git (the repository's top). Found in a parent, the command runs there,
as git runs from the top of its work tree: the defaults relative to the fleet's folder (build/plans,
checkov-skips.yaml, build/sites, build/vpn) resolve from it, while paths given on the command line keep meaning what
they meant where the command was typed. An explicit --fleet is taken as given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FLEET = Path("fleet.yaml")  # the default --fleet; compared by identity, so `--fleet fleet.yaml` stays as given


def find_root(start: Path) -> Path | None:
    """The nearest folder from `start` upward that holds fleet.yaml, not past a repository's top; None if none."""
    for folder in (start, *start.parents):
        if (folder / FLEET).is_file():
            return folder
        if (folder / ".git").exists():
            return None
    return None


@contextlib.contextmanager
def from_root(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[None]:
    """Run the command from the fleet's folder when --fleet was not given and fleet.yaml is in a parent."""
    here = Path.cwd()
    root = find_root(here) if getattr(args, "fleet", None) is FLEET else None
    if root is None or root == here:
        yield
        return
    _anchor_given_paths(parser, args, here)
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(here)


def _anchor_given_paths(parser: argparse.ArgumentParser, args: argparse.Namespace, here: Path) -> None:
    """Make the relative paths typed on the command line absolute from where they were typed; defaults stay."""
    defaults: dict[str, list[Any]] = {}
    path_options: set[str] = set()
    for action in _actions(parser):
        defaults.setdefault(action.dest, []).append(action.default)
        if action.type is Path:
            path_options.add(action.dest)
    for dest in path_options:
        value = getattr(args, dest, None)
        if any(value is default for default in defaults[dest]):
            continue
        if isinstance(value, Path) and not value.is_absolute():
            setattr(args, dest, here / value)
        elif isinstance(value, list):
            setattr(args, dest, [here / v if isinstance(v, Path) and not v.is_absolute() else v for v in value])


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to walk its subcommands
        yield action
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for child in action.choices.values():
                yield from _actions(child)
