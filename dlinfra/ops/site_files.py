"""`dlinfra site render`: a site gateway's and GPU machines' files from its home stack's outputs, checked against
the fleet, and the commands that install them (docs/site-onboarding.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dlinfra.errors import DlinfraError
from dlinfra.files import write_atomic, write_private
from dlinfra.model import gpu_health
from dlinfra.model.fleet.schema import Fleet, Site
from dlinfra.model.sites import stack_of
from dlinfra.ops.stack_outputs import SECRET_PLACEHOLDER, as_int, check_stack, require_output
from dlinfra.render.failover import FailoverBudget, failover_budget
from dlinfra.render.frr import render_frr
from dlinfra.render.kernel import render_nftables, render_sysctl, render_xfrm_script
from dlinfra.render.nodeadm import HybridNodeView, render_node_config
from dlinfra.render.site_vpn import SiteVpnView, Tunnel
from dlinfra.render.strongswan import render_charon, render_swanctl

# Where the site-gateway Chef role expects the rendered files (chef/cookbooks/dlinfra_gateway attributes).
DEFAULT_INSTALL_DIR = "/etc/dlinfra/site"
GPU_EXPECTATION_FILE = "gpu-expect.json"  # the GPU machines' burn-in expectation, beside their NodeConfig


@dataclass(frozen=True)
class RenderedSite:
    """What `site render` wrote."""

    view: SiteVpnView
    files: dict[str, Path]  # role (swanctl, frr, charon, sysctl, nftables, xfrm, node, ...) -> path
    failover: FailoverBudget  # worst case from an AWS endpoint going silent to the other tunnel, per the files


# The gateway's files other than swanctl.conf and its node JSON, by role (names the cookbook expects).
GATEWAY_FILES: Final[Mapping[str, str]] = {
    "frr": "frr.conf",
    "charon": "strongswan-dlinfra.conf",
    "sysctl": "sysctl-dlinfra-gateway.conf",
    "nftables": "dlinfra-mss.nft",
    "xfrm": "dlinfra-xfrm",
}


def site_view(fleet: Fleet, site: str, outputs: Mapping[str, Any], *, source: str) -> SiteVpnView:
    """The render helper's view of one site, from the home stack's outputs, checked against the fleet."""
    spec = fleet.sites[site]
    stack = stack_of(fleet, site)
    check_stack(outputs, spec.environment, spec.region, source=source)
    connections = require_output(outputs, "site_vpns", source=source, stack=stack)
    if not isinstance(connections, Mapping) or site not in connections:
        raise DlinfraError(
            f"no VPN for site {site!r} in the outputs: run `pulumi up --stack {stack}` after `site add`",
            file=source,
            key=f"site_vpns.{site}",
        )
    conn = require_output(connections, site, source=source, stack=stack)
    key = f"site_vpns.{site}"
    stale = _stale_fields(spec, conn)
    if stale:
        raise DlinfraError(
            f"the stack outputs disagree with the fleet on {', '.join(stale)}; "
            f"run `pulumi up --stack {stack}` and export the outputs again",
            file=source,
            key=key,
        )
    try:
        tunnels = tuple(
            Tunnel(
                number=as_int(t["number"], f"{key}.tunnels.number", source),
                outside_ip=str(t["outside_address"]),
                inside_cidr=str(t["inside_cidr"]),
                preshared_key=_unmasked(t["preshared_key"], f"{key}.tunnels.preshared_key", source),
            )
            for t in conn["tunnels"]
        )
        return SiteVpnView(
            site=site,
            local_public_ip=str(conn["public_ip"]),
            lan_cidr=str(conn["lan"]),
            remote_cidrs=tuple(str(c) for c in conn["remote_cidrs"]),
            tunnels=tunnels,  # type: ignore[arg-type]  # SiteVpnView checks there are exactly two
            routing=str(conn["routing"]),
            local_asn=as_int(conn["asn"], f"{key}.asn", source),
            remote_asn=as_int(conn["transit_asn"], f"{key}.transit_asn", source),
            pod_cidrs=tuple(str(c) for c in conn.get("pod_cidrs") or ()),
            tunnel_mode=spec.tunnel_mode,
        )
    except KeyError as exc:
        raise DlinfraError(f"missing field {exc.args[0]!r}", file=source, key=key) from None
    except (TypeError, ValueError) as exc:
        raise DlinfraError(str(exc), file=source, key=key) from None


def _unmasked(value: Any, what: str, source: str) -> str:
    if value == SECRET_PLACEHOLDER:
        raise DlinfraError(
            "the value is masked; export with `pulumi stack output --json --show-secrets`",
            file=source,
            key=what,
        )
    return str(value)


def _stale_fields(spec: Site, conn: Mapping[str, Any]) -> list[str]:
    fields = {"public_ip": str(spec.public_ip), "routing": spec.routing, "asn": spec.asn}
    out = []
    for name, want in fields.items():
        got = conn.get(name)
        if isinstance(want, int) and isinstance(got, int | float) and not isinstance(got, bool):
            got = int(got) if float(got).is_integer() else got
        if got != want:
            out.append(name)
    return out


def gateway_node(
    fleet: Fleet, site: str, view: SiteVpnView, conn: Mapping[str, Any], *, install_dir: str
) -> dict[str, Any]:
    """Chef node JSON for the site gateway (role site-gateway); points at the secret files, holds none."""
    spec = fleet.sites[site]
    swanctl = f"{install_dir}/swanctl.conf"
    # Route-based sites route over FRR (static routes or BGP); policy-based ones need it for BGP with AWS or
    # with their hybrid nodes.
    frr = f"{install_dir}/{GATEWAY_FILES['frr']}" if render_frr(view) is not None else None
    gateway: dict[str, Any] = {
        "routing": view.routing,
        "tunnel_mode": view.tunnel_mode,
        "swanctl_source": swanctl,
        "frr": frr is not None,
        "charon_source": f"{install_dir}/{GATEWAY_FILES['charon']}",
        "sysctl_source": f"{install_dir}/{GATEWAY_FILES['sysctl']}",
        "nftables_source": f"{install_dir}/{GATEWAY_FILES['nftables']}",
    }
    if frr:
        gateway["frr_source"] = frr
    if view.route_based:
        gateway["xfrm_source"] = f"{install_dir}/{GATEWAY_FILES['xfrm']}"
    return {
        "run_list": ["role[site-gateway]"],
        "dlinfra": {
            "site": {
                "name": site,
                "environment": spec.environment,
                "region": spec.region,
                "public_ip": view.local_public_ip,
                "asn": view.local_asn,
                "transit_asn": view.remote_asn,
                "routing": view.routing,
                "tunnel_mode": view.tunnel_mode,
                "lan": view.lan_cidr,
                "pod_cidrs": list(view.pod_cidrs),
                "remote_cidrs": list(view.remote_cidrs),
                "customer_gateway_id": conn.get("customer_gateway_id"),
                "vpn_connection_id": conn.get("vpn_connection_id"),
                "tunnels": [
                    {
                        "number": t.number,
                        "outside_address": t.outside_ip,
                        "inside_cidr": t.inside_cidr,
                        "aws_inside_address": t.aws_inside_ip,
                        "site_inside_address": t.site_inside_ip,
                        "interface": view.interface(t) if view.route_based else None,
                    }
                    for t in view.tunnels
                ],
                "swanctl_conf": swanctl,
                "frr_conf": frr,
                "nfs": [{"server": str(m.server), "export": m.export, "mount_point": m.mount_point} for m in spec.nfs],
            }
        },
        "dlinfra_gateway": gateway,
    }


def render_site(
    fleet: Fleet,
    site: str,
    outputs: Mapping[str, Any],
    out_dir: Path,
    *,
    source: str,
    install_dir: str = DEFAULT_INSTALL_DIR,
) -> RenderedSite:
    """Write the gateway's files (swanctl.conf 0600, frr.conf, charon, sysctl and nftables settings, the XFRM
    interface script) and its Chef node JSON into out_dir, and the GPU machines' files where the site has some."""
    if site not in fleet.sites:
        known = ", ".join(fleet.sites) or "none"
        raise DlinfraError(f"no site {site!r} in the fleet (sites: {known})", key=f"sites.{site}")
    view = site_view(fleet, site, outputs, source=source)
    conn = outputs["site_vpns"][site]
    swanctl = render_swanctl(view)
    frr = render_frr(view)
    node = gateway_node(fleet, site, view, conn, install_dir=install_dir)
    files = {"swanctl": out_dir / "swanctl.conf", "node": out_dir / "site-gateway.json"}
    write_private(files["swanctl"], swanctl)
    public: dict[str, str | None] = {
        "frr": frr,
        "charon": render_charon(view),
        "sysctl": render_sysctl(view),
        "nftables": render_nftables(view),
        "xfrm": render_xfrm_script(view),
    }
    for role, text in public.items():
        if text is not None:
            files[role] = out_dir / GATEWAY_FILES[role]
            write_atomic(files[role], text, mode=0o755 if role == "xfrm" else 0o644)
    write_atomic(files["node"], json.dumps(node, indent=2, sort_keys=True) + "\n", mode=0o644)
    hybrid = hybrid_view(fleet, site, outputs, source=source)
    if hybrid is not None:
        files["nodeadm"] = out_dir / "nodeadm.yaml"
        write_private(files["nodeadm"], render_node_config(hybrid))
        files["gpu-node"] = out_dir / "site-gpu-node.json"
        gpu_node = gpu_node_json(fleet, site, install_dir=install_dir)
        write_atomic(files["gpu-node"], json.dumps(gpu_node, indent=2, sort_keys=True) + "\n", mode=0o644)
        spec = fleet.sites[site]
        if spec.gpus_per_node:  # what the machines' GPU burn-in expects (dlinfra.model.gpu_health)
            files["gpu-expect"] = out_dir / GPU_EXPECTATION_FILE
            product = gpu_health.site_product(spec.gpu_model, spec.gpu_product)
            expect = gpu_health.site_expectation(spec.gpu_model, product, spec.gpus_per_node, spec.gpu_check)
            write_atomic(files["gpu-expect"], json.dumps(expect, indent=2, sort_keys=True) + "\n", mode=0o644)
    return RenderedSite(view=view, files=files, failover=failover_budget(public["charon"] or "", swanctl, frr))


def hybrid_view(fleet: Fleet, site: str, outputs: Mapping[str, Any], *, source: str) -> HybridNodeView | None:
    """The join settings of a site's GPU machines, or None when the site has none (gpu_nodes: 0)."""
    spec = fleet.sites[site]
    if spec.gpu_nodes == 0:
        return None
    stack = stack_of(fleet, site)
    activations = require_output(outputs, "hybrid_activations", source=source, stack=stack)
    if not isinstance(activations, Mapping) or site not in activations:
        raise DlinfraError(
            f"hybrid_activations has no entry for {site}; run `pulumi up --stack {stack}` and export the outputs again",
            file=source,
            key="hybrid_activations",
        )
    activation = activations[site]
    try:
        return HybridNodeView(
            site=site,
            cluster_name=_unmasked(
                require_output(outputs, "cluster_name", source=source, stack=stack), "cluster_name", source
            ),
            region=spec.region,
            activation_id=_unmasked(activation.get("id"), f"hybrid_activations.{site}.id", source),
            activation_code=_unmasked(activation.get("code"), f"hybrid_activations.{site}.code", source),
            gpu_labels=gpu_health.site_gpu_labels(spec, fleet.environments[spec.environment].gpu_product_label),
            cluster_dns=_cluster_dns(outputs, source=source, stack=stack),
        )
    except ValueError as exc:
        raise DlinfraError(str(exc), file=source, key=f"hybrid_activations.{site}") from None


def _cluster_dns(outputs: Mapping[str, Any], *, source: str, stack: str) -> tuple[str, ...]:
    """The kubelet's DNS servers the regional stack exports (its NodeLocal DNS cache first, then kube-dns)."""
    value = require_output(outputs, "cluster_dns", source=source, stack=stack)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise DlinfraError(f"expected a list of addresses, got {value!r}", file=source, key="cluster_dns")
    return tuple(value)


def gpu_node_json(fleet: Fleet, site: str, *, install_dir: str) -> dict[str, Any]:
    """Chef node JSON for the site's GPU machines (role site-gpu-node); the NodeConfig holds the secret."""
    spec = fleet.sites[site]
    hybrid: dict[str, Any] = {
        "kubernetes_version": fleet.environments[spec.environment].kubernetes.version,
        "credential_provider": "ssm",
        "node_config_source": f"{install_dir}/nodeadm.yaml",
        "nfs_mounts": [{"server": str(m.server), "export": m.export, "mount_point": m.mount_point} for m in spec.nfs],
    }
    if spec.gpus_per_node:
        hybrid["gpu_expectation_source"] = f"{install_dir}/{GPU_EXPECTATION_FILE}"
    return {"run_list": ["role[site-gpu-node]"], "dlinfra_hybrid": hybrid}


# What the operator runs after `site render`. docs/site-onboarding.md shows these same commands (a test keeps
# them equal), run on each machine from the directory the rendered files were copied to.
ONBOARDING_GUIDE = "docs/site-onboarding.md"
# Where the site machines keep a copy of chef/ (chef/README.md, "Converging a site machine").
CHEF_REPO_DIR = "/var/lib/dlinfra/chef"


@dataclass(frozen=True)
class InstallStep:
    """Commands for one kind of machine, in the order they run."""

    where: str  # on the gateway, on each GPU machine, ...
    commands: tuple[str, ...]


def install_steps(files: Mapping[str, Path], *, install_dir: str = DEFAULT_INSTALL_DIR) -> list[InstallStep]:
    """The commands that install what `site render` wrote (files: role -> path) and check each machine."""

    def converge(node_json: Path) -> str:
        return (
            f"sudo cinc-client --local-mode --chef-repo-path {CHEF_REPO_DIR} "
            f"--json-attributes {install_dir}/{node_json.name}"
        )

    # The gateway gets only its own files: the NodeConfig's activation code stays off it, and the tunnels'
    # keys off the GPU machines.
    roles = ("swanctl", *GATEWAY_FILES, "node")
    gateway_files = [files[role].name for role in roles if role in files]
    gateway = [
        f"sudo install -d -m 0700 {install_dir}",
        f"sudo install -m 0600 -t {install_dir} {' '.join(gateway_files)}",
        converge(files["node"]),
        "sudo swanctl --list-sas",
    ]
    if "xfrm" in files:
        # Route-based: the tunnel interfaces, up with their inside addresses, and the routes over both.
        gateway += ["ip -d link show type xfrm", "ip route show"]
    if "frr" in files:
        gateway.append("sudo vtysh -c 'show bgp summary'")
    steps = [InstallStep("on the site gateway", tuple(gateway))]
    if "nodeadm" in files:
        steps.append(
            InstallStep(
                "on each GPU machine",
                (
                    f"sudo install -d -m 0700 {install_dir}",
                    f"sudo install -m 0600 -t {install_dir} {files['nodeadm'].name} {files['gpu-node'].name}",
                    *(
                        [f"sudo install -m 0644 -t {install_dir} {files['gpu-expect'].name}"]
                        if "gpu-expect" in files
                        else []
                    ),
                    converge(files["gpu-node"]),
                ),
            )
        )
        steps.append(
            InstallStep(
                "from a workstation with cluster access",
                ("kubectl get nodes -l eks.amazonaws.com/compute-type=hybrid -o wide",),
            )
        )
    return steps
