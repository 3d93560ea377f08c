"""Command line: `python -m dlinfra validate | cidr | preview | check | pool roll ...`.

Every command takes --fleet and --lock; without --fleet, fleet.yaml is looked for here and then upward, and the
command runs from its folder (dlinfra.cli.root). Bad input exits 2 with one message naming the file and key;
nothing is written when a command fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra.cli import (
    access,
    checks,
    cost,
    doctor,
    fleet,
    gpu,
    network,
    pools,
    preview,
    quota,
    root,
    run,
    server,
    what_happened,
)
from dlinfra.cli.common import EXIT_BAD_INPUT, Handler, err
from dlinfra.errors import DlinfraError
from dlinfra.ops.aws import describe as describe_aws_error


def _shared_options(*, subcommand: bool) -> argparse.ArgumentParser:
    """--fleet and --lock. On subcommands they default to SUPPRESS: argparse copies a subparser's defaults over
    the parent's values, so `dlinfra --fleet F validate` would silently read fleet.yaml otherwise."""
    shared = argparse.ArgumentParser(add_help=False)
    fleet_default: Any = argparse.SUPPRESS if subcommand else root.FLEET
    lock_default: Any = argparse.SUPPRESS if subcommand else None
    shared.add_argument(
        "--fleet",
        default=fleet_default,
        type=Path,
        help="fleet file (default: fleet.yaml here or in the nearest parent, as git finds its repository)",
    )
    shared.add_argument(
        "--lock", default=lock_default, type=Path, help="address-plan lock (default: cidr-lock.yaml beside the fleet)"
    )
    return shared


def version() -> str:
    """The installed package's version, or a note saying the package is not installed."""
    try:
        return f"dlinfra {metadata.version('dlinfra')}"
    except metadata.PackageNotFoundError:
        return f"dlinfra (not installed as a package: run `pip install -e {ROOT}`; running from source)"


def _parser() -> argparse.ArgumentParser:
    common = _shared_options(subcommand=True)
    parser = argparse.ArgumentParser(
        prog="dlinfra",
        description=__doc__.splitlines()[0],
        parents=[_shared_options(subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=version(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = (
        fleet.register_validate_and_cidr(sub, common)
        | preview.register(sub, common)
        | fleet.register_stacks(sub, common)
        | network.register(sub, common)
        | checks.register(sub, common)
        | access.register(sub, common)
        | cost.register(sub, common)
        | quota.register(sub, common)
        | pools.register(sub, common)
        | what_happened.register(sub, common)
        | run.register(sub, common)
        | gpu.register(sub, common)
        | doctor.register(sub)
        | server.register(sub)
    )
    parser.set_defaults(handlers=handlers)
    _add_examples(parser, "")
    return parser


# One example per command, shown under its --help; keyed by the command path ("site add").
EXAMPLES: dict[str, str] = {
    "": "dlinfra --fleet fleet.yaml validate\n  dlinfra preview --all --summary\n  dlinfra check --all",
    "validate": "dlinfra validate --fleet fleet.yaml",
    "cidr": "dlinfra cidr --update            # after adding a region or site\n"
    "  dlinfra cidr --release site-lan/ams1   # once site ams1 is out of the fleet",
    "preview": "dlinfra preview --all --summary\n  dlinfra preview --stack prod-us-west-2",
    "stacks": "dlinfra stacks --json --only prod-us-west-2-k8s",
    "server": "dlinfra server start   # later commands of this checkout start in milliseconds\n"
    "  dlinfra server status --json",
    "site": "dlinfra site list",
    "site list": "dlinfra site list --json",
    "site add": "dlinfra site add lax1 --region us-west-2 --public-ip 64.62.140.99 --asn 65110 --bgp \\\n"
    "      --gpu-nodes 4 --lan 10.60.0.0/20 --nfs 10.60.0.5:/export/data:/data --activation-expiry 14d",
    "site remove": "dlinfra site remove lax1            # keeps its address ranges reserved",
    "site render": "dlinfra site render ams1 --offline",
    "vpn": "dlinfra vpn profile --environment staging --region us-west-2 --user alice --offline",
    "vpn profile": "dlinfra vpn profile --environment staging --region us-west-2 --user alice --offline"
    "   # certificates\n  dlinfra vpn profile --region us-west-2 --offline   # prod: federated sign-in, no --user",
    "check": "dlinfra preview --all && dlinfra check --all",
    "reach": "dlinfra reach --verbose",
    "diff": "dlinfra diff --base origin/main --out plan-diff.md",
    "access": "dlinfra access --env prod --team vision",
    "cost": "dlinfra preview --all && dlinfra cost --json",
    "quota": "dlinfra quota --env staging\n  dlinfra quota --team vision --json",
    "pool": "dlinfra pool roll --stack prod-us-west-2 --pool train-h100",
    "pool roll": "dlinfra pool roll --stack prod-us-west-2 --pool train-h100",
    "what-happened": "dlinfra what-happened i-0123456789abcdef0 --since 6h",
    "gpu": "dlinfra gpu expect --env prod --region us-west-2 --pool train-h100 --dcgm-level 2 --out expect.json",
    "gpu expect": "dlinfra gpu expect --instance-type p5.48xlarge --efa --out expect.json",
    "gpu status": "dlinfra gpu status --context prod-us-west-2",
    "gpu check": "dlinfra gpu check ip-10-1-0-2.us-west-2.compute.internal --context prod-us-west-2",
    "gpu labels": "dlinfra gpu labels --context prod-us-west-2",
    "run": "dlinfra run --env prod --team vision --gpus 1 -- python train.py --epochs 3",
    "doctor": "dlinfra doctor",
}


def _add_examples(parser: argparse.ArgumentParser, path: str) -> None:
    """Give every command an example epilog kept as written (RawDescriptionHelpFormatter)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    example = EXAMPLES.get(path)
    if example is not None and not parser.epilog:
        parser.epilog = f"Example:\n  {example}"
    # argparse has no public way to walk its subcommands.
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, child in action.choices.items():
                _add_examples(child, f"{path} {name}".strip())


EXIT_ERROR_DETAILED = 1  # an error, under --detailed-exitcode (0: no changes, 2: changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = _parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:
        # With --detailed-exitcode, 2 means "changes": a usage error must read as an error (1).
        if exc.code == 2 and "--detailed-exitcode" in words:
            return EXIT_ERROR_DETAILED
        raise
    failed = EXIT_ERROR_DETAILED if getattr(args, "detailed_exitcode", False) else EXIT_BAD_INPUT
    try:
        handler: Handler = args.handlers[args.command]
        with root.from_root(parser, args):
            return handler(args)
    except DlinfraError as exc:
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)))  # Text: the message echoes user input
        return failed
    except Exception as exc:
        # An AWS error a command did not expect (no credentials, an endpoint out of reach, a refused call) is still
        # one line, as dlinfra.ops.aws words it; anything else is a bug and keeps its traceback.
        if not type(exc).__module__.startswith("botocore."):
            raise
        err.print(Text.assemble(("error:", "bold red"), " ", f"AWS: {describe_aws_error(exc)}"))
        return failed


def served(argv: Sequence[str]) -> int:
    """main, in a child of the warm server (dlinfra.serving.forkserver). The module-level consoles were made when
    the server imported them, from its streams and environment (colour, width, NO_COLOR): made again for this
    command's, with the settings they were made with."""
    for module in [m for name, m in sys.modules.items() if name.startswith("dlinfra.")]:
        for value in list(vars(module).values()):
            if isinstance(value, Console):
                highlight = value._highlight  # noqa: SLF001 - rich keeps its constructor's setting only here
                type(value).__init__(value, stderr=value.stderr, highlight=highlight, soft_wrap=value.soft_wrap)
    return main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
