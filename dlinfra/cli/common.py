"""What every command shares: the consoles, the handler type, the lock beside the fleet, loading the fleet with
its cross-environment checks, and pulumi-style markers and progress."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from dlinfra.model import eks, kueue
from dlinfra.model.fleet.load import LoadedFleet, load_fleet, version_lifecycle

EXIT_BAD_INPUT = 2  # bad input: one message naming the file and key

Handler = Callable[[argparse.Namespace], int]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def lock_file(args: argparse.Namespace) -> Path:
    lock: Path = args.lock if args.lock is not None else Path(args.fleet).parent / "cidr-lock.yaml"
    return lock


def load_checked(args: argparse.Namespace) -> LoadedFleet:
    """The fleet, with the checks that span environments (team GPU quotas) and the cluster versions' support
    dates done before anything else; warnings go to stderr."""
    loaded = load_fleet(args.fleet)
    kueue.check_fleet(loaded.fleet, source=str(loaded.path))
    for warning in version_lifecycle(loaded, eks.today()):
        err.print(f"warning: {warning}", markup=False)
    return loaded


# pulumi preview's markers and colours, by operation.
MARKERS = {"create": ("+", "green"), "update": ("~", "yellow"), "delete": ("-", "red"), "replace": ("+-", "magenta")}


def marker(op: str) -> Text:
    symbol, style = MARKERS[op]
    return Text(symbol, style=style)


@contextlib.contextmanager
def progress(what: str, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (stacks done out of total), only on a terminal; yields advance(name)."""
    if not err.is_terminal or total < 2:
        yield lambda _name: None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(what, total=total)

        def advance(name: str) -> None:
            progress.update(task, advance=1, description=escape(f"{what}: {name} done"))

        yield advance
