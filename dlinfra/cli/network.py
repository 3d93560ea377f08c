"""Network commands: `dlinfra site add|remove|render` and `dlinfra vpn profile`.

`register` adds them to dlinfra.cli's parser; bad input raises DlinfraError (the CLI prints it, exits 2).
Nothing is written unless the whole change validated; secrets only go to files created mode 0600.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra import files
from dlinfra.cli.common import Handler, Output, lock_file, working
from dlinfra.errors import DlinfraError
from dlinfra.model import planner, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.sites import ACTIVATION_MAX_DAYS
from dlinfra.ops import onboarding, site_files, stack_outputs
from dlinfra.render.failover import FailoverBudget
from dlinfra.render.openvpn import ClientVpnProfile, render_ovpn

out = Output(highlight=False, soft_wrap=True)  # in a pipe, tables as wide as their rows
err = Console(stderr=True, highlight=False, soft_wrap=True)
SITES_SCHEMA = "dlinfra.sites/v1"  # `site list --json`


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add the `site` and `vpn` commands to the CLI; returns command name -> handler."""
    site = subparsers.add_parser("site", help="list, onboard, remove and render physical GPU sites")
    site_sub = site.add_subparsers(dest="site_command", required=True, metavar="{list,add,remove,render}")

    listing = site_sub.add_parser("list", parents=[common], help="the fleet's sites: region, routing, GPUs, address")
    listing.add_argument(
        "--json",
        action="store_true",
        help=f"print {{schema: {SITES_SCHEMA}, sites: [...]}}, the sites as the fleet has them (docs/json.md)",
    )

    add = site_sub.add_parser("add", parents=[common], help="add a site to the fleet and allocate its address ranges")
    add.add_argument("name", help="site name (2-24 lower-case letters, digits and '-')")
    add.add_argument("--region", required=True, help="home region: the transit gateway the site's VPN lands on")
    add.add_argument("--public-ip", required=True, help="public IPv4 address of the site gateway")
    add.add_argument("--asn", required=True, type=_integer("--asn"), help="the site's BGP ASN")
    add.add_argument("--environment", default="prod", help="environment the site joins (default: prod)")
    add.add_argument("--lan", help="the site LAN as a CIDR (default: allocated from the address space)")
    routing = add.add_mutually_exclusive_group()
    routing.add_argument("--bgp", dest="routing", action="store_const", const="bgp", help="announce routes by BGP")
    routing.add_argument(
        "--static", dest="routing", action="store_const", const="static", help="static routes (default)"
    )
    add.add_argument("--gpu-nodes", type=_integer("--gpu-nodes"), help="machines that join as hybrid nodes")
    add.add_argument(
        "--gpus-per-node", type=_integer("--gpus-per-node"), help="GPUs in each of those machines (default: 8)"
    )
    add.add_argument("--gpu-model", help="GPU model of those machines, e.g. H100 or A100 (default: H100)")
    add.add_argument(
        "--gpu-product",
        help="their GPUs' name as nvidia-smi --query-gpu=name prints it, where the model comes as more than one "
        "(A100: 'NVIDIA A100-SXM4-40GB' or 'NVIDIA A100-SXM4-80GB')",
    )
    add.add_argument(
        "--nfs",
        action="append",
        default=[],
        type=_nfs_mount,
        metavar="SERVER:EXPORT:MOUNT",
        help="an NFS export the GPU nodes mount (repeatable), e.g. 10.60.0.5:/export/data:/data",
    )
    add.add_argument("--pod-cidr", help="the hybrid nodes' pod CIDR (default: allocated from the address space)")
    add.add_argument(
        "--activation-expiry",
        type=_expiry,
        metavar="WHEN",
        help="until when the GPU machines may register: a UTC instant (2026-12-20T00:00:00Z) or days from now (14d), "
        f"at most {ACTIVATION_MAX_DAYS} days ahead (default: AWS's 24 hours after the apply)",
    )

    remove = site_sub.add_parser("remove", parents=[common], help="remove a site from the fleet")
    remove.add_argument("name", help="the site to remove (see `dlinfra site list`)")
    remove.add_argument(
        "--release", action="store_true", help="also free its address ranges (default: keep them reserved)"
    )

    render = site_sub.add_parser(
        "render", parents=[common], help="render swanctl.conf, frr.conf and the gateway's Chef node JSON"
    )
    render.add_argument("name", help="the site to render (see `dlinfra site list`)")
    _outputs_source(render)
    render.add_argument("--out", type=Path, help="output folder (default: build/sites/<name>)")
    render.add_argument(
        "--install-dir",
        default=site_files.DEFAULT_INSTALL_DIR,
        help=f"where the files go on the gateway, for the node JSON (default: {site_files.DEFAULT_INSTALL_DIR})",
    )

    vpn = subparsers.add_parser("vpn", help="laptop VPN (AWS Client VPN)")
    vpn_sub = vpn.add_subparsers(dest="vpn_command", required=True, metavar="{profile}")
    profile = vpn_sub.add_parser("profile", parents=[common], help="render an OpenVPN (.ovpn) profile")
    profile.add_argument("--region", required=True, help="region of the Client VPN endpoint")
    profile.add_argument("--environment", default="prod", help="environment of the endpoint (default: prod)")
    _outputs_source(profile)
    profile.add_argument(
        "--user", help="whose profile (certificate sign-in: a name in environments.<env>.client_vpn.users)"
    )
    profile.add_argument("--out", type=Path, help="profile path (default: build/vpn/<env>-<region>[-<user>].ovpn)")
    return {"site": cmd_site, "vpn": cmd_vpn}


def _outputs_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--outputs", type=Path, metavar="FILE", help="JSON of `pulumi stack output --json --show-secrets`"
    )
    source.add_argument(
        "--offline",
        action="store_true",
        help="take the outputs from an offline run of the stack (fake cloud)",
    )


def _integer(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} is not an integer") from None

    return parse


def _expiry(text: str) -> datetime.datetime:
    """An instant as given, or `<days>d` from now to the minute."""
    days = re.fullmatch(r"(\d+)d", text)
    if days:
        now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
        return now + datetime.timedelta(days=int(days.group(1)))
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--activation-expiry: {text!r} is neither a UTC instant (2026-12-20T00:00:00Z) nor days from now (14d)"
        ) from None


def _nfs_mount(text: str) -> tuple[str, str, str]:
    parts = text.split(":")
    if len(parts) != 3 or not all(parts) or not parts[1].startswith("/") or not parts[2].startswith("/"):
        raise argparse.ArgumentTypeError(
            f"--nfs: {text!r} is not SERVER:EXPORT:MOUNT (e.g. 10.60.0.5:/export/data:/data; paths absolute)"
        )
    return parts[0], parts[1], parts[2]


# --- site ------------------------------------------------------------------------------------------------
def cmd_site(args: argparse.Namespace) -> int:
    handler = {"list": _site_list, "add": _site_add, "remove": _site_remove, "render": _site_render}[args.site_command]
    return handler(args)


def _site_add(args: argparse.Namespace) -> int:
    fleet_path = Path(args.fleet)
    _check_address(args.public_ip, f"sites.{args.name}.public_ip", fleet_path)
    if args.lan is not None:
        _check_network(args.lan, f"sites.{args.name}.lan", fleet_path)
    if args.pod_cidr is not None:
        _check_network(args.pod_cidr, f"sites.{args.name}.pod_cidr", fleet_path)
    new = onboarding.NewSite(
        name=args.name,
        region=args.region,
        public_ip=args.public_ip,
        asn=args.asn,
        environment=args.environment,
        lan=args.lan,
        routing=args.routing or "static",
        gpu_nodes=args.gpu_nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_model=args.gpu_model,
        gpu_product=args.gpu_product,
        nfs=tuple(args.nfs),
        pod_cidr=args.pod_cidr,
        activation_expiry=args.activation_expiry,
    )
    change = onboarding.add_site(fleet_path, lock_file(args), new)
    out.print(f"added site {new.name} to {fleet_path} (home stack {change.home_stack})", markup=False)
    for key, net in change.allocations.items():
        out.print(f"  {key:<24} {net}", markup=False)
    out.print(f"wrote {lock_file(args)}", markup=False)
    out.print("\nNext steps:")
    for i, step in enumerate(onboarding.next_steps_after_add(change, fleet_path), start=1):
        out.print(f"  {i}. {step}", markup=False)
    return 0


def _site_list(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet).fleet
    if args.json:
        rows = [{"name": name, **site.model_dump(mode="json")} for name, site in fleet.sites.items()]
        sys.stdout.write(json.dumps({"schema": SITES_SCHEMA, "sites": rows}, indent=2) + "\n")
        return 0
    if not fleet.sites:
        out.print(f"no sites in {args.fleet}; add one with `dlinfra site add NAME --region R --public-ip IP --asn N`")
        return 0
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("site", "region", "environment", "routing", "GPU nodes", "public IP"):
        table.add_column(column, overflow="fold")
    for name, site in fleet.sites.items():
        gpus = f"{site.gpu_nodes} x {site.gpus_per_node} {site.gpu_model}" if site.gpu_nodes else "0"
        cells = (name, site.region, site.environment, site.routing, gpus, str(site.public_ip))
        table.add_row(*(Text(c) for c in cells))
    out.print(table)
    return 0


def _check_address(text: str, key: str, fleet_path: Path) -> None:
    """A clearer message than the schema's for the commonest mistakes (malformed, private)."""
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError:
        raise DlinfraError(
            f"{text!r} is not an IPv4 address (four numbers 0-255, e.g. 198.51.100.7)",
            file=str(fleet_path),
            key=key,
        ) from None
    if ip.is_private or ip.is_reserved or ip.is_loopback or ip.is_link_local or ip.is_multicast or not ip.is_global:
        raise DlinfraError(
            f"{ip} is not a public address (private, shared, reserved or special-purpose); the customer "
            "gateway needs the site gateway's public IPv4 address",
            file=str(fleet_path),
            key=key,
        )


def _check_network(text: str, key: str, fleet_path: Path) -> None:
    try:
        ipaddress.IPv4Network(text)
    except ValueError:
        try:
            loose = ipaddress.IPv4Network(text, strict=False)
        except ValueError:
            raise DlinfraError(
                f"{text!r} is not an IPv4 CIDR such as 10.60.0.0/20", file=str(fleet_path), key=key
            ) from None
        raise DlinfraError(f"{text} has host bits set; did you mean {loose}?", file=str(fleet_path), key=key) from None


def _site_remove(args: argparse.Namespace) -> int:
    change = onboarding.remove_site(Path(args.fleet), lock_file(args), args.name, release=args.release)
    out.print(f"removed site {args.name} from {args.fleet}", markup=False)
    if change.released:
        out.print(f"released {len(change.allocations)} allocation(s) in {lock_file(args)}:", markup=False)
    else:
        out.print(
            f"kept {len(change.allocations)} allocation(s) reserved in {lock_file(args)} "
            "(orphans: never reused until `dlinfra cidr --release KEY`):"
        )
    for key, net in change.allocations.items():
        out.print(f"  {key:<24} {net}", markup=False)
    out.print("\nNext, once its nodes are drained (docs/site-onboarding.md, section 10), apply in this order:")
    for step in onboarding.apply_steps(change):
        out.print(f"  {step}", markup=False)
    return 0


def _site_render(args: argparse.Namespace) -> int:
    loaded = load_fleet(args.fleet)
    fleet = loaded.fleet
    if args.name not in fleet.sites:
        known = ", ".join(fleet.sites) or "none"
        raise DlinfraError(
            f"no site {args.name!r} in the fleet (sites: {known})",
            file=str(args.fleet),
            key=f"sites.{args.name}",
        )
    spec = fleet.sites[args.name]
    outputs, source = _outputs(args, fleet, spec.environment, spec.region)
    out_dir = args.out or Path("build/sites") / args.name
    rendered = site_files.render_site(fleet, args.name, outputs, out_dir, source=source, install_dir=args.install_dir)
    for role, path in rendered.files.items():
        note = " (mode 0600: holds the pre-shared keys)" if role == "swanctl" else ""
        out.print(f"wrote {path}{note}", markup=False)
    for line in _failover_lines(rendered.view.tunnel_mode, rendered.failover):
        out.print(line, markup=False)
    out.print(
        f"\nNext steps ({site_files.ONBOARDING_GUIDE}): copy {out_dir}/ to the machines and, in that directory, run",
        markup=False,
    )
    for step in site_files.install_steps(rendered.files, install_dir=args.install_dir):
        out.print(f"  {step.where}:", markup=False)
        for command in step.commands:
            out.print(f"    {command}", markup=False)
    return 0


def _failover_lines(tunnel_mode: str, budget: FailoverBudget) -> list[str]:
    """What `site render` says about failover: each direction's worst case for this site's routing."""
    site = f"DPD probe after {budget.dpd_delay:.0f} s, charon gives up {budget.ike_give_up:.1f} s later"
    aws_dpd = budget.aws_dpd_idle + budget.aws_dpd_timeout
    if budget.bgp_hold is None:
        routing = "static routing"
        # AWS publishes when its DPD gives up after its first keep-alive, not when it sends that: an estimate.
        aws = (
            f"after about {budget.aws:.0f} s (AWS's DPD: a keep-alive after about {budget.aws_dpd_idle:.0f} s of "
            f"silence, the gateway dead {budget.aws_dpd_timeout:.0f} s later; a static VPN has nothing faster)"
        )
        both = f"after about {budget.end_to_end:.0f} s"
    else:
        routing = "BGP"
        site += f"; the {budget.bgp_hold:.0f} s BGP hold timer as backstop"
        aws = (
            f"within {budget.aws:.1f} s (its {budget.bgp_hold:.0f} s BGP hold timer; its DPD would take about "
            f"{aws_dpd:.0f} s)"
        )
        both = f"within {budget.end_to_end:.1f} s"
    return [
        f"tunnels: {tunnel_mode}-based, {routing}; when an AWS endpoint goes silent, traffic leaves its tunnel",
        f"  from the gateway within {budget.site:.1f} s ({site})",
        f"  from AWS {aws}",
        f"  both ways {both}",
    ]


def _outputs(args: argparse.Namespace, fleet: Fleet, env: str, region: str) -> tuple[Mapping[str, Any], str]:
    """The regional stack's outputs: from the JSON file, or from an offline run of the stack."""
    if args.outputs is not None:
        return stack_outputs.load_outputs(args.outputs), str(args.outputs)
    role = stackroles.parse(fleet, f"{env}-{region}", fleet_file=str(args.fleet))
    planner.plan(load_fleet(args.fleet), planner.load_lock(lock_file(args)))  # fail early, with file and key
    from dlinfra.offline import engine  # imports pulumi: only when an offline run is asked for

    config = {
        "dlinfra:fleet": str(Path(args.fleet).resolve()),
        "dlinfra:lock": str(lock_file(args).resolve()),
    }
    with working(f"running {role.name} offline for its outputs"):
        result = engine.run_stack(ROOT, role, project=fleet.project, config=config, stack_exports={})
    err.print(f"offline outputs of {role.name} (fake cloud: addresses and keys are not real)")
    return result.outputs, f"offline {role.name}"


# --- vpn -------------------------------------------------------------------------------------------------
def cmd_vpn(args: argparse.Namespace) -> int:
    return {"profile": _vpn_profile}[args.vpn_command](args)


def _vpn_profile(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet).fleet
    env, region = args.environment, args.region
    stack = f"{env}-{region}"
    stackroles.parse(fleet, stack, fleet_file=str(args.fleet))
    vpn = fleet.environments[env].client_vpn
    if vpn is None:
        raise DlinfraError(
            "no client_vpn: this environment has no Client VPN endpoint",
            file=str(args.fleet),
            key=f"environments.{env}.client_vpn",
        )
    if vpn.users and args.user not in vpn.users:
        given = f"--user {args.user!r} is not listed" if args.user else "--user NAME is required"
        raise DlinfraError(
            f"{given}: profiles are per person; listed: {', '.join(vpn.users)}",
            file=str(args.fleet),
            key=f"environments.{env}.client_vpn.users",
        )
    if vpn.saml and args.user:
        with_users = [name for name, e in fleet.environments.items() if e.client_vpn and e.client_vpn.users]
        elsewhere = (
            f"; certificate sign-in is in {', '.join(with_users)} (--environment {with_users[0]})" if with_users else ""
        )
        raise DlinfraError(
            f"--user is for certificate sign-in, and {env} uses federated sign-in (everyone uses the same profile "
            f"and signs in as themselves): drop --user, as in `dlinfra vpn profile --environment {env} --region "
            f"{region} --outputs FILE`{elsewhere}",
            file=str(args.fleet),
            key=f"environments.{env}.client_vpn.saml",
        )
    outputs, source = _outputs(args, fleet, env, region)
    stack_outputs.check_stack(outputs, env, region, source=source)
    values = {
        field: stack_outputs.require_output(outputs, f"client_vpn_{field}", source=source, stack=stack)
        for field in ("dns_name", "server_name", "ca_cert_pem")
    }
    cert = key = None
    if vpn.users:
        people = stack_outputs.require_output(outputs, "client_vpn_users", source=source, stack=stack)
        person = people.get(args.user) if isinstance(people, dict) else None
        if not isinstance(person, dict):
            raise DlinfraError(f"client_vpn_users has no {args.user!r}: apply the stack first", file=source)
        cert, key = str(person["cert_pem"]), str(person["key_pem"])
    try:
        profile = ClientVpnProfile(
            name=f"{fleet.project} {stack}" + (f" ({args.user})" if args.user else ""),
            endpoint_dns_name=str(values["dns_name"]),
            server_name=str(values["server_name"]),
            ca_cert_pem=str(values["ca_cert_pem"]),
            client_cert_pem=cert,
            client_key_pem=key,
        )
    except ValueError as exc:
        raise DlinfraError(str(exc), file=source) from None
    path = args.out or Path("build/vpn") / (f"{stack}-{args.user}.ovpn" if args.user else f"{stack}.ovpn")
    files.write_private(path, render_ovpn(profile))
    what = (
        "federated sign-in, no key" if profile.federated else f"holds {args.user}'s private key: give it to them only"
    )
    out.print(f"wrote {path} (mode 0600; {what})", markup=False)
    return 0
