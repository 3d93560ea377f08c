"""What every command shares: the consoles, the handler type, the lock beside the fleet, loading the fleet with
its cross-environment checks, and pulumi-style markers and progress."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console, ConsoleDimensions
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.spinner import Spinner
from rich.text import Text

from dlinfra.model import eks, kueue
from dlinfra.model.fleet.load import LoadedFleet, load_fleet, version_lifecycle

EXIT_BAD_INPUT = 2  # bad input: one message naming the file and key

Handler = Callable[[argparse.Namespace], int]

# Columns a table may take when its console is not a terminal: as many as its rows need, in practice.
PIPE_WIDTH = 4096


class Output(Console):
    """A console that, when it writes to a pipe or a file, lays tables out as wide as their rows need: rich lays
    out 80 columns when it finds no terminal, which cuts an ARN in a table to "arn:aws:iam::1111…"."""

    @property
    def size(self) -> ConsoleDimensions:
        size: ConsoleDimensions = Console.size.__get__(self)
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size


out = Output(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def lock_file(args: argparse.Namespace) -> Path:
    lock: Path = args.lock if args.lock is not None else Path(args.fleet).parent / "cidr-lock.yaml"
    return lock


def load_checked(args: argparse.Namespace, *, warn: Callable[[str], None] | None = None) -> LoadedFleet:
    """The fleet, with the checks that span environments (team GPU quotas) and the cluster versions' support
    dates done before anything else; warnings go to stderr, or to `warn` (one `file: key: problem` line each)."""
    loaded = load_fleet(args.fleet)
    kueue.check_fleet(loaded.fleet, source=str(loaded.path))
    for warning in version_lifecycle(loaded, eks.today()):
        if warn is None:
            err.print(f"warning: {warning}", markup=False)
        else:
            warn(warning)
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


@contextlib.contextmanager
def working(what: str) -> Iterator[None]:
    """A spinner on stderr saying what a slow step (over a second) is doing, only when stderr is a terminal, and
    gone when it ends. stdout is left alone: what a command prints in a pipe stays as it was."""
    if not err.is_terminal:
        yield
        return
    spinner = Spinner("dots", Text(what))
    with Live(spinner, console=err, transient=True, redirect_stdout=False, redirect_stderr=False):
        yield


@contextlib.contextmanager
def status(what: str) -> Iterator[Callable[[str], None]]:
    """As working(), for a command of several slow steps: yields say(step), which shows `what: step` on the
    spinner. On a terminal only; elsewhere say() does nothing."""
    if not err.is_terminal:
        yield lambda _step: None
        return
    spinner = Spinner("dots", Text(what))
    with Live(spinner, console=err, transient=True, redirect_stdout=False, redirect_stderr=False):

        def say(step: str) -> None:
            spinner.update(text=Text(f"{what}: {step}"))

        yield say


def side(text: str) -> str:
    """A BASE or HEAD argument as typed (`preview --base`, `diff`): a plan folder made absolute where it was typed,
    before a command started in a subdirectory moves to the fleet's folder; a revision left as it is."""
    from dlinfra.review.diff import revisions

    return revisions.side(text)
