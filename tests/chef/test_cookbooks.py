"""chef/: what can honestly be checked without Chef: Ruby and ERB syntax, RuboCop, rendered templates,
dlinfra.checks.chef on the real repository, and agreement with dlinfra's own data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from dlinfra.checks import chef as chefcheck
from dlinfra.model import gpu_health, gpu_sharing, instances
from tests.conftest import REFERENCE_FLEET

ROOT = Path(__file__).resolve().parents[2]
CHEF = ROOT / "chef"
RUBY_FILES = sorted([*CHEF.rglob("*.rb"), CHEF / "Berksfile"])
TEMPLATES = sorted(CHEF.rglob("*.erb"))
COOKBOOKS = sorted(p.parent for p in CHEF.glob("cookbooks/*/metadata.rb"))

# Renders an ERB template the way Chef does (trim mode "-"), with instance variables from JSON.
RENDER = """
require 'erb'
require 'json'
context = Object.new
JSON.parse(ARGV[1]).each { |name, value| context.instance_variable_set("@#{name}", value) }
print ERB.new(File.read(ARGV[0]), trim_mode: '-').result(context.instance_eval { binding })
"""


def run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def render(ruby: str, template: str, **variables: Any) -> str:
    result = run(ruby, "-e", RENDER, str(CHEF / "cookbooks" / template), json.dumps(variables))
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- syntax and style -----------------------------------------------------------------------------------


@pytest.mark.chef
@pytest.mark.parametrize("path", RUBY_FILES, ids=lambda p: str(p.relative_to(CHEF)))
def test_ruby_syntax(path: Path, require_tool: Callable[[str], str]) -> None:
    result = run(require_tool("ruby"), "-c", str(path))
    assert result.returncode == 0 and "Syntax OK" in result.stdout, result.stderr


@pytest.mark.chef
@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(CHEF)))
def test_erb_template_compiles(path: Path, require_tool: Callable[[str], str]) -> None:
    code = run(require_tool("erb"), "-x", "-T", "-", str(path))
    assert code.returncode == 0, code.stderr
    result = run(require_tool("ruby"), "-c", stdin=code.stdout)
    assert result.returncode == 0 and "Syntax OK" in result.stdout, result.stderr


@pytest.mark.chef
def test_rubocop(require_tool: Callable[[str], str]) -> None:
    result = run(require_tool("rubocop"), "--config", ".rubocop.yml", "--format", "simple", cwd=CHEF)
    assert result.returncode == 0, result.stdout + result.stderr
    inspected = re.search(r"(\d+) files? inspected", result.stdout)
    assert inspected and int(inspected.group(1)) >= len(RUBY_FILES), "RuboCop must see every Ruby file"


# -- rendered templates ---------------------------------------------------------------------------------


@pytest.mark.chef
@pytest.mark.parametrize("runtime", ["runc", "nvidia"])
def test_containerd_config_is_valid_toml(runtime: str, require_tool: Callable[[str], str]) -> None:
    text = render(
        require_tool("ruby"),
        "dlinfra_base/templates/containerd-config.toml.erb",
        sandbox_image="registry.k8s.io/pause:3.10",
        default_runtime=runtime,
        nvidia_runtime_binary="/usr/bin/nvidia-container-runtime",
    )
    config = tomllib.loads(text)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert config["version"] == 2
    assert cri["containerd"]["default_runtime_name"] == runtime
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes[runtime]["options"]["SystemdCgroup"] is True
    assert ("nvidia" in runtimes) == (runtime == "nvidia")


@pytest.mark.chef
def test_frr_daemons_enable_only_the_wanted_daemons(require_tool: Callable[[str], str]) -> None:
    known = ["bgpd", "ospfd", "ospf6d", "bfdd"]
    text = render(
        require_tool("ruby"),
        "dlinfra_gateway/templates/frr-daemons.erb",
        enabled=["bgpd", "bfdd"],
        known=known,
    )
    assert re.findall(r"^(\w+d)=(yes|no)$", text, re.M) == [
        ("bgpd", "yes"),
        ("ospfd", "no"),
        ("ospf6d", "no"),
        ("bfdd", "yes"),
    ]
    assert "vtysh_enable=yes" in text
    assert 'bgpd_options="-A 127.0.0.1"' in text
    assert "ospfd_options" not in text


@pytest.mark.chef
def test_fabric_manager_gate_lists_the_nvswitch_types(require_tool: Callable[[str], str], tmp_path: Path) -> None:
    types = ["p4d.24xlarge", "p5.48xlarge"]
    text = render(require_tool("ruby"), "dlinfra_gpu/templates/needs-fabricmanager.sh.erb", instance_types=types)
    assert re.findall(r"^  (\S+)\) exit 0 ;;$", text, re.M) == types
    script = tmp_path / "gate.sh"
    script.write_text(text)
    assert run("sh", "-n", str(script)).returncode == 0


@pytest.mark.chef
def test_chrony_prefers_explicit_servers(require_tool: Callable[[str], str]) -> None:
    ruby = require_tool("ruby")
    with_servers = render(ruby, "dlinfra_base/templates/chrony.conf.erb", servers=["169.254.169.123"], pools=["p"])
    assert "server 169.254.169.123 prefer iburst" in with_servers and "pool " not in with_servers
    pools_only = render(ruby, "dlinfra_base/templates/chrony.conf.erb", servers=[], pools=["ntp.ubuntu.com"])
    assert "pool ntp.ubuntu.com iburst" in pools_only


# -- static checks with dlinfra.checks.chef -----------------------------------------------------------------


def test_chefcheck_finds_nothing_in_the_repository() -> None:
    assert [str(f) for f in chefcheck.check(CHEF)] == []


def test_chefcheck_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert chefcheck.main([str(CHEF)]) == 0
    assert chefcheck.main([str(tmp_path)]) == 2
    assert "not a Chef repository" in capsys.readouterr().err


# -- agreement with dlinfra's data and the house rules ---------------------------------------------------


def test_fabric_manager_types_match_the_instance_table() -> None:
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    match = re.search(r"\['fabricmanager'\]\['instance_types'\] = %w\((.*?)\)", attributes, re.S)
    assert match is not None
    nvswitch = {t.name for t in instances.all_types().values() if t.nvswitch}
    assert set(match.group(1).split()) == nvswitch


@pytest.mark.parametrize("cookbook", COOKBOOKS, ids=lambda p: p.name)
def test_cookbook_layout(cookbook: Path) -> None:
    metadata = (cookbook / "metadata.rb").read_text()
    for field in ("name", "description", "version", "chef_version", "supports"):
        assert re.search(rf"^{field} ", metadata, re.M), f"{cookbook.name}/metadata.rb lacks {field}"
    assert (cookbook / "attributes" / "default.rb").is_file()
    assert (cookbook / "recipes" / "default.rb").is_file()
    assert (cookbook / "libraries" / "helpers.rb").is_file(), "platform logic belongs in libraries/"


@pytest.mark.parametrize("recipe", sorted(CHEF.glob("cookbooks/*/recipes/*.rb")), ids=lambda p: p.stem)
def test_recipes_are_thin(recipe: Path) -> None:
    # Logic (methods, loops over computed data, raw shell pipelines) goes to libraries/ helpers.
    text = recipe.read_text()
    assert not re.search(r"^\s*def ", text, re.M)
    assert len(text.splitlines()) <= 60


@pytest.mark.parametrize("role", sorted((CHEF / "roles").glob("*.json")), ids=lambda p: p.stem)
def test_role_files_are_chef_roles(role: Path) -> None:
    data = json.loads(role.read_text())
    assert data["json_class"] == "Chef::Role" and data["chef_type"] == "role"
    assert data["name"] == role.stem and data["description"]


@pytest.mark.parametrize("role", ["cpu-node", "gpu-node", "site-gpu-node", "site-gateway"])
def test_each_role_has_an_example_node(role: Path) -> None:
    node = json.loads((CHEF / "nodes" / f"{role}.json").read_text())
    assert node["run_list"] == [f"role[{role}]"]


def test_site_example_nodes_match_the_reference_fleet() -> None:
    site = yaml.safe_load((REFERENCE_FLEET).read_text())["sites"]["sjc1"]
    node = json.loads((CHEF / "nodes" / "site-gpu-node.json").read_text())
    assert node["dlinfra_hybrid"]["nfs_mounts"] == site["nfs"]
    gateway = json.loads((CHEF / "nodes" / "site-gateway.json").read_text())
    assert gateway["dlinfra_gateway"]["routing"] == site["routing"]


def test_secrets_stay_out_of_example_nodes_and_attributes() -> None:
    # Activation codes and pre-shared keys come from `dlinfra site render` files, never attributes.
    for path in [
        *CHEF.glob("nodes/*.json"),
        *CHEF.glob("roles/*.json"),
        *CHEF.glob("cookbooks/*/attributes/*.rb"),
    ]:
        text = path.read_text().lower()
        assert "activationcode" not in text and "preshared" not in text and "secret" not in text, path


STUB_CURL = """#!/usr/bin/env bash
case "${@: -1}" in
  */api/token) echo TOKEN ;;
  */instance-id) echo i-0123456789abcdef0 ;;
  */placement/availability-zone) echo us-west-2a ;;
  */local-ipv4) echo 10.1.2.3 ;;
  */local-hostname) echo ip-10-1-2-3.us-west-2.compute.internal ;;
  *) exit 22 ;;
esac
"""
STUB_AWS = """#!/usr/bin/env bash
echo "$*" >>"$STUB_LOG"
printf 'https://ABCDEF.gr7.us-west-2.eks.amazonaws.com\\tLS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\\t172.20.0.0/16\\n'
"""
STUB_SYSTEMCTL = """#!/usr/bin/env bash
echo "systemctl $*" >>"$STUB_LOG"
"""


@pytest.mark.chef
@pytest.mark.parametrize(
    ("dns_args", "cluster_dns"),
    [
        # What the pools pass (dlinfra.model.dns.node_dns_servers): the node's NodeLocal DNS cache, then kube-dns.
        (["--cluster-dns", "169.254.20.10,172.20.0.10"], ["169.254.20.10", "172.20.0.10"]),
        ([], ["172.20.0.10"]),  # without it: kube-dns, the tenth address of the cluster's service range
    ],
)
def test_node_join_writes_kubelet_configuration(
    tmp_path: Path, require_tool: Callable[[str], str], dns_args: list[str], cluster_dns: list[str]
) -> None:
    # The user data of components/nodepool.py calls this script; run it against stubbed IMDS and AWS.
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("curl", STUB_CURL), ("aws", STUB_AWS), ("systemctl", STUB_SYSTEMCTL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    script = tmp_path / "dlinfra-node-join"
    script.write_text(
        render(
            require_tool("ruby"),
            "dlinfra_base/templates/dlinfra-node-join.sh.erb",
            aws_cli=str(stubs / "aws"),
            credential_provider_dir="/usr/local/lib/dlinfra/credential-providers",
            default_max_pods=110,
            kube_reserved_cpu="250m",
            kube_reserved_memory="1Gi",
        )
    )
    root, log = tmp_path / "root", tmp_path / "calls.log"
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "DLINFRA_ROOT": str(root),
        "STUB_LOG": str(log),
    }
    args = ["--cluster", "dlinfra-prod-usw2", "--region", "us-west-2", "--node-labels", "a=b,c=d"]
    args += ["--register-with-taints", "nvidia.com/gpu=true:NoSchedule", "--max-pods", "234", *dns_args]
    result = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr

    config = yaml.safe_load((root / "etc/kubernetes/kubelet/config.yaml").read_text())
    assert config["providerID"] == "aws:///us-west-2a/i-0123456789abcdef0"
    assert config["clusterDNS"] == cluster_dns
    assert config["maxPods"] == 234
    assert config["registerWithTaints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert config["cgroupDriver"] == "systemd"
    kubeconfig = yaml.safe_load((root / "var/lib/kubelet/kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://ABCDEF.gr7.us-west-2.eks.amazonaws.com"
    assert kubeconfig["users"][0]["user"]["exec"]["args"][-3:] == [
        "dlinfra-prod-usw2",
        "--region",
        "us-west-2",
    ]
    assert (root / "etc/kubernetes/pki/ca.crt").read_text().startswith("-----BEGIN CERTIFICATE-----")
    dropin = (root / "etc/systemd/system/kubelet.service.d/10-dlinfra.conf").read_text()
    assert "--hostname-override=ip-10-1-2-3.us-west-2.compute.internal" in dropin
    assert "--node-labels=a=b,c=d" in dropin and "--node-ip=10.1.2.3" in dropin
    calls = log.read_text()
    assert "eks describe-cluster --region us-west-2 --name dlinfra-prod-usw2" in calls
    assert "systemctl restart kubelet" in calls
    # --no-start (a MIG node about to reboot): the same configuration, and kubelet left to start at the next boot.
    log.unlink()
    again = subprocess.run(
        ["bash", str(script), *args, "--no-start"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load((root / "etc/kubernetes/kubelet/config.yaml").read_text()) == config
    assert "systemctl daemon-reload" in log.read_text() and "kubelet" not in log.read_text()


@pytest.mark.chef
def test_node_join_rejects_missing_arguments(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    script = tmp_path / "join"
    script.write_text(
        render(
            require_tool("ruby"),
            "dlinfra_base/templates/dlinfra-node-join.sh.erb",
            aws_cli="aws",
            credential_provider_dir="/x",
            default_max_pods=110,
            kube_reserved_cpu="250m",
            kube_reserved_memory="1Gi",
        )
    )
    result = subprocess.run(["bash", str(script), "--region", "us-west-2"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "--cluster and --region are required" in result.stderr


SHELL_TEMPLATES: dict[str, tuple[str, dict[str, Any]]] = {
    "dlinfra_base/templates/dlinfra-node-join.sh.erb": (
        "bash",
        {
            "aws_cli": "/snap/bin/aws",
            "credential_provider_dir": "/usr/local/lib/dlinfra/credential-providers",
            "default_max_pods": 110,
            "kube_reserved_cpu": "250m",
            "kube_reserved_memory": "1Gi",
        },
    ),
    "dlinfra_gpu/templates/needs-fabricmanager.sh.erb": ("sh", {"instance_types": ["p5.48xlarge"]}),
    "dlinfra_gpu/templates/mig-layout.sh.erb": (
        "bash",
        {"layout": "/etc/dlinfra/mig-layout", "reboot_marker": "/var/lib/x", "defer_reboot": "/run/x"},
    ),
}


@pytest.mark.chef
@pytest.mark.parametrize("template", sorted(SHELL_TEMPLATES))
def test_rendered_shell_templates_pass_shellcheck(
    template: str, tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    shell, variables = SHELL_TEMPLATES[template]
    script = tmp_path / "script"
    script.write_text(render(require_tool("ruby"), template, **variables))
    result = run(require_tool("shellcheck"), f"--shell={shell}", str(script))
    assert result.returncode == 0, result.stdout


@pytest.mark.chef
@pytest.mark.parametrize(("instance_type", "status"), [("p5.48xlarge", 0), ("g6.12xlarge", 1), (None, 1)])
def test_fabric_manager_gate_decides_by_instance_type(
    instance_type: str | None, status: int, tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    if any(
        (dev / "vendor").read_text().strip() == "0x10de" and (dev / "class").read_text().startswith("0x0680")
        for dev in Path("/sys/bus/pci/devices").glob("*")
    ):
        pytest.skip("this machine has an NVSwitch: the gate passes before it asks IMDS")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    answer = f"echo {instance_type}" if instance_type else "exit 7"  # None: IMDS unreachable
    (stubs / "curl").write_text(f'#!/bin/sh\ncase "$*" in *api/token*) echo T ;; *) {answer} ;; esac\n')
    (stubs / "curl").chmod(0o755)
    gate = tmp_path / "gate"
    gate.write_text(
        render(
            require_tool("ruby"),
            "dlinfra_gpu/templates/needs-fabricmanager.sh.erb",
            instance_types=sorted(t.name for t in instances.all_types().values() if t.nvswitch),
        )
    )
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", str(gate)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == status, result.stderr


# -- the site gateway: what `dlinfra site render` writes is what the cookbook installs ------------------
GATEWAY = CHEF / "cookbooks" / "dlinfra_gateway"


def _ruby_constant(name: str) -> str:
    match = re.search(rf"^\s+{name} = '([^']+)'\.freeze$", (GATEWAY / "libraries" / "helpers.rb").read_text(), re.M)
    assert match is not None, name
    return match.group(1)


def test_gateway_installs_the_xfrm_script_where_charons_updown_calls_it() -> None:
    from dlinfra.render import kernel

    assert _ruby_constant("XFRM_SCRIPT") == kernel.XFRM_SCRIPT


def test_gateway_attributes_point_at_every_file_site_render_writes() -> None:
    from dlinfra.ops import site_files

    attributes = (GATEWAY / "attributes" / "default.rb").read_text()
    defaults = dict(re.findall(r"^default\['dlinfra_gateway'\]\['(\w+)'\] = '([^']*)'$", attributes, re.M))
    for role, name in site_files.GATEWAY_FILES.items():
        assert defaults[f"{role}_source"] == f"{site_files.DEFAULT_INSTALL_DIR}/{name}", role
    assert defaults["tunnel_mode"] == "route"
    # Every key the rendered node JSON sets is one the cookbook declares (chefcheck checks the reverse).
    node = json.loads((ROOT / "tests" / "render" / "golden" / "sjc1-site-gateway.json").read_text())
    declared = set(re.findall(r"^default\['dlinfra_gateway'\]\['(\w+)'\]", attributes, re.M))
    assert set(node["dlinfra_gateway"]) <= declared


def test_gateway_recipes_install_each_rendered_file() -> None:
    recipes = "".join(p.read_text() for p in (GATEWAY / "recipes").glob("*.rb"))
    for key in ("swanctl_source", "frr_source", "charon_source", "sysctl_source", "nftables_source", "xfrm_source"):
        assert f"dlinfra_site_file(node['dlinfra_gateway']['{key}'])" in recipes, key
    # The interfaces and rules come before strongSwan, so SAs bound to an if_id find their interface.
    default = (GATEWAY / "recipes" / "default.rb").read_text()
    assert default.index("dlinfra_gateway::network") < default.index("dlinfra_gateway::strongswan")


@pytest.mark.chef
@pytest.mark.parametrize("route_based", [True, False])
def test_gateway_boot_unit_creates_interfaces_then_loads_the_rules(
    route_based: bool, require_tool: Callable[[str], str]
) -> None:
    xfrm = _ruby_constant("XFRM_SCRIPT")
    text = render(
        require_tool("ruby"),
        "dlinfra_gateway/templates/dlinfra-gateway-net.service.erb",
        xfrm_script=xfrm if route_based else None,
        nftables_file=_ruby_constant("NFTABLES_FILE"),
    )
    starts = re.findall(r"^ExecStart=(.*)$", text, re.M)
    expected = [f"{xfrm} start"] if route_based else []
    assert starts == [*expected, "/usr/sbin/nft -f /etc/dlinfra/dlinfra-mss.nft"]
    assert "Before=strongswan.service frr.service" in text and "RemainAfterExit=yes" in text
    assert "ExecStop" not in text  # a restart must never delete a live tunnel's interface


def test_kitchen_fixtures_are_what_site_render_writes() -> None:
    from dlinfra.render import kernel, strongswan
    from tests.render.vpn_views import view

    fixtures = CHEF / "test" / "cookbooks" / "dlinfra_test" / "files" / "site"
    v = view()
    assert (fixtures / "strongswan-dlinfra.conf").read_text() == strongswan.render_charon(v)
    assert (fixtures / "sysctl-dlinfra-gateway.conf").read_text() == kernel.render_sysctl(v)
    assert (fixtures / "dlinfra-mss.nft").read_text() == kernel.render_nftables(v)
    assert (fixtures / "dlinfra-xfrm").read_text() == kernel.render_xfrm_script(v)


# -- the GPU burn-in ----------------------------------------------------------------------------------------------


def _gpu_check_attribute(name: str) -> str:
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    match = re.search(rf"\['gpu_check'\]\['{name}'\] = '?([^'\n]*)'?$", attributes, re.M)
    assert match is not None, name
    return match.group(1)


def test_the_burn_in_unit_runs_where_dlinfra_says() -> None:
    # The user data, site render and the burn-in agent use gpu_health's paths; the machine's unit must match.
    assert _gpu_check_attribute("expectation") == gpu_health.EXPECT_PATH
    assert _gpu_check_attribute("report_dir") == gpu_health.REPORT_DIR
    assert _gpu_check_attribute("unit") == gpu_health.CHECK_UNIT
    assert int(_gpu_check_attribute("timeout_seconds")) == gpu_health.BURN_IN_SECONDS
    # The user data looks for the unit where the recipe writes it, to tell an image with the check from one without.
    recipe = (CHEF / "cookbooks" / "dlinfra_gpu" / "recipes" / "gpu_check.rb").read_text()
    user_data = (ROOT / "components" / "templates" / "node-user-data.sh.j2").read_text()
    assert """template "/etc/systemd/system/#{check['unit']}" do""" in recipe
    assert "[[ -f /etc/systemd/system/{{ check_unit }} ]]" in user_data
    hybrid = (CHEF / "cookbooks" / "dlinfra_hybrid" / "recipes" / "gpu_check.rb").read_text()
    # start, never restart: a converge must not run the check again under jobs (the unit stays active this boot).
    assert "node['dlinfra_gpu']['gpu_check']" in hybrid and "'start', '--no-block'" in hybrid
    assert "restart" not in hybrid.split("execute", 1)[1]


def test_the_mig_layout_is_applied_where_dlinfra_writes_it(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    assert f"['mig']['layout'] = '{gpu_sharing.MIG_LAYOUT_PATH}'" in attributes
    assert f"['mig']['unit'] = '{gpu_sharing.MIG_UNIT}'" in attributes
    assert f"['mig']['reboot_marker'] = '{gpu_sharing.MIG_REBOOT_MARKER}'" in attributes
    assert f"['mig']['defer_reboot'] = '{gpu_sharing.MIG_DEFER_REBOOT}'" in attributes
    user_data = (ROOT / "components" / "templates" / "node-user-data.sh.j2").read_text()
    assert "[[ -f /etc/systemd/system/{{ mig_unit }} ]]" in user_data
    # The layout comes before the check reads the GPUs, on a new node (user data) and after a reboot (ordering).
    assert user_data.index("{{ mig_unit }}") < user_data.index("{{ check_unit }}")
    check = (CHEF / "cookbooks" / "dlinfra_gpu" / "templates" / "dlinfra-gpu-check.service.erb").read_text()
    assert gpu_sharing.MIG_UNIT in check.split("After=", 1)[1].splitlines()[0]
    text = render(
        require_tool("ruby"), "dlinfra_gpu/templates/dlinfra-mig.service.erb", script="/bin/true",
        layout=gpu_sharing.MIG_LAYOUT_PATH, check_unit=gpu_health.CHECK_UNIT,
    )  # fmt: skip
    assert f"Before=nvidia-dcgm.service {gpu_health.CHECK_UNIT} kubelet.service" in text
    unit = tmp_path / gpu_sharing.MIG_UNIT
    unit.write_text(text)
    result = run(require_tool("systemd-analyze"), "verify", "--man=no", "--recursive-errors=no", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_burn_in_environment_pins_what_the_repository_tests() -> None:
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    pins = dict(re.findall(r"^  '([\w-]+)' => '([^']+)'", attributes, re.M))
    assert set(pins) == {"nvidia-ml-py", "torch"}
    # NVML's bindings: a version inside requirements.txt's range, so the check's tests ran against its API.
    (requirement,) = [r for r in (ROOT / "requirements.txt").read_text().splitlines() if r.startswith("nvidia-ml-py")]
    assert Version(pins["nvidia-ml-py"]) in SpecifierSet(requirement.removeprefix("nvidia-ml-py"))
    # The 570 driver runs CUDA 12.x: PyTorch from PyPI at this release is built for CUDA 12.8 (its Requires-Dist).
    assert _driver_branch() == "570" and pins["torch"] == "2.9.1"


def _driver_branch() -> str:
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    match = re.search(r"\['driver'\]\['branch'\] = '(\d+)'", attributes)
    assert match is not None
    return match.group(1)


def test_the_burn_in_unit_is_a_valid_systemd_unit(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    ruby, analyze = require_tool("ruby"), require_tool("systemd-analyze")
    script = tmp_path / "gpu_check.py"
    script.write_text("")
    text = render(
        ruby,
        "dlinfra_gpu/templates/dlinfra-gpu-check.service.erb",
        python=sys.executable,
        script=str(script),
        expectation=gpu_health.EXPECT_PATH,
        report=gpu_health.REPORT_PATH,
        timeout_seconds=gpu_health.BURN_IN_SECONDS,
    )
    assert f"TimeoutStartSec={gpu_health.BURN_IN_SECONDS}" in text and "SuccessExitStatus=1 2" in text
    unit = tmp_path / gpu_health.CHECK_UNIT
    unit.write_text(text)
    result = run(analyze, "verify", "--man=no", "--recursive-errors=no", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_watch_unit_runs_where_dlinfra_says() -> None:
    # The burn-in agent reads HEALTH_PATH and judges a watch stopped by WATCH_INTERVAL_SECONDS; the unit must match.
    from tests.chef._gpu_check import gpu_check

    assert _gpu_check_attribute("watch_unit") == gpu_health.WATCH_UNIT
    interval = int(_gpu_check_attribute("watch_interval_seconds"))
    assert interval == gpu_health.WATCH_INTERVAL_SECONDS == gpu_check.WATCH_INTERVAL_SECONDS
    recipe = (CHEF / "cookbooks" / "dlinfra_gpu" / "recipes" / "gpu_check.rb").read_text()
    assert "health: ::File.join(check['report_dir'], 'health.json')" in recipe
    assert f"{_gpu_check_attribute('report_dir')}/health.json" == gpu_health.HEALTH_PATH
    assert """template "/etc/systemd/system/#{check['watch_unit']}" do""" in recipe
    assert "[check['unit'], check['watch_unit']].each { |unit| service(unit) { action :enable } }" in recipe


def test_the_watch_unit_is_a_valid_systemd_unit_that_follows_the_check(
    tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    ruby, analyze = require_tool("ruby"), require_tool("systemd-analyze")
    script = tmp_path / "gpu_check.py"
    script.write_text("")
    text = render(
        ruby,
        "dlinfra_gpu/templates/dlinfra-gpu-watch.service.erb",
        python=sys.executable,
        script=str(script),
        expectation=gpu_health.EXPECT_PATH,
        health=gpu_health.HEALTH_PATH,
        interval_seconds=gpu_health.WATCH_INTERVAL_SECONDS,
        check_unit=gpu_health.CHECK_UNIT,
    )
    settings = re.findall(r"^(\w+)=(.*)$", text, re.M)
    assert ("ExecStart", f"{sys.executable} {script} watch {gpu_health.EXPECT_PATH} --health {gpu_health.HEALTH_PATH} "
                         f"--interval {gpu_health.WATCH_INTERVAL_SECONDS}") in settings  # fmt: skip
    assert {("Type", "simple"), ("Restart", "always"), ("ConditionPathExists", gpu_health.EXPECT_PATH)} <= set(settings)
    # Never beside the burn-in: ordered after the check, and started by whatever starts the check (the user data's
    # `systemctl start --no-block`) as by every boot.
    (after,) = [value.split() for key, value in settings if key == "After"]
    (wanted_by,) = [value.split() for key, value in settings if key == "WantedBy"]
    assert gpu_health.CHECK_UNIT in after and set(wanted_by) == {"multi-user.target", gpu_health.CHECK_UNIT}
    unit = tmp_path / gpu_health.WATCH_UNIT
    unit.write_text(text)
    result = run(analyze, "verify", "--man=no", "--recursive-errors=no", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the GPU repair -----------------------------------------------------------------------------------------------


def test_the_repair_runs_where_dlinfra_says() -> None:
    # The burn-in agent writes gpu_health.REPAIR_REQUEST through its hostPath; the machine's units must watch and run
    # on that file, and the script must know the same actions the controller approves.
    from tests.chef._gpu_check import gpu_check

    repair_dir = _gpu_check_attribute("repair_dir")
    assert repair_dir == gpu_health.REPAIR_DIR and f"{repair_dir}/request" == gpu_health.REPAIR_REQUEST
    assert _gpu_check_attribute("repair_path_unit") == gpu_health.REPAIR_PATH_UNIT
    assert _gpu_check_attribute("repair_unit") == gpu_health.REPAIR_UNIT
    assert int(_gpu_check_attribute("repair_group")) == 65534  # the agent's runAsGroup (components/pod_scripts.py)
    assert gpu_check.REPAIR_ACTIONS == gpu_health.REPAIR_ACTIONS
    recipes = CHEF / "cookbooks" / "dlinfra_gpu" / "recipes"
    recipe = (recipes / "gpu_repair.rb").read_text()
    assert recipe.count("request: ::File.join(check['repair_dir'], 'request')") == 2  # both units, one file
    # The AWS CLI where dlinfra_base installs it for the node join, passed to the unit rather than written twice.
    assert "aws_cli: node['dlinfra_base']['node_join']['aws_cli']" in recipe
    assert "service check['repair_path_unit'] do" in recipe and "action %i(enable start)" in recipe
    assert "command ['systemd-tmpfiles', '--create', tmpfiles]" in recipe  # the directory at image build, too
    assert "include_recipe 'dlinfra_gpu::gpu_repair'" in (recipes / "gpu_check.rb").read_text()


def _repair_units(tmp_path: Path, ruby: str) -> tuple[Path, Path]:
    """(service, path unit) rendered as the recipe renders them, in tmp_path."""
    script = tmp_path / "gpu_check.py"
    script.write_text("")
    service = tmp_path / gpu_health.REPAIR_UNIT
    service.write_text(
        render(
            ruby,
            "dlinfra_gpu/templates/dlinfra-gpu-repair.service.erb",
            python=sys.executable,
            script=str(script),
            request=gpu_health.REPAIR_REQUEST,
            aws_cli="/snap/bin/aws",
        )
    )
    path = tmp_path / gpu_health.REPAIR_PATH_UNIT
    path.write_text(
        render(
            ruby,
            "dlinfra_gpu/templates/dlinfra-gpu-repair.path.erb",
            request=gpu_health.REPAIR_REQUEST,
            repair_unit=gpu_health.REPAIR_UNIT,
        )
    )
    return service, path


def test_the_repair_units_are_valid_systemd_units_started_by_the_request(
    tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    from tests.chef._gpu_check import gpu_check

    ruby, analyze = require_tool("ruby"), require_tool("systemd-analyze")
    service, path = _repair_units(tmp_path, ruby)
    settings = re.findall(r"^(\w+)=(.*)$", service.read_text(), re.M)
    script = tmp_path / "gpu_check.py"
    assert (
        "ExecStart",
        f"{sys.executable} {script} repair {gpu_health.REPAIR_REQUEST} --aws-cli /snap/bin/aws",
    ) in settings
    # RemainAfterExit: a repair carried out keeps its request, and PathExists would start the unit again at once.
    assert {("Type", "oneshot"), ("RemainAfterExit", "yes")} <= set(settings)
    (timeout,) = [int(value) for key, value in settings if key == "TimeoutStartSec"]
    assert timeout > gpu_check.REPAIR_COMMAND_SECONDS + 3 * gpu_check.IMDS_SECONDS
    assert not re.search(r"^\[Install\]", service.read_text(), re.M)  # started by the path unit only
    path_settings = set(re.findall(r"^(\w+)=(.*)$", path.read_text(), re.M))
    assert {("PathExists", gpu_health.REPAIR_REQUEST), ("Unit", gpu_health.REPAIR_UNIT),
            ("WantedBy", "multi-user.target")} <= path_settings  # fmt: skip
    result = run(analyze, "verify", "--man=no", "--recursive-errors=no", str(path), str(service))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_repair_directory_lets_the_agent_add_a_request_and_nothing_more(
    tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    ruby = require_tool("ruby")
    text = render(
        ruby, "dlinfra_gpu/templates/dlinfra-gpu-repair.conf.erb", directory=gpu_health.REPAIR_DIR, group=65534
    )
    (line,) = [line for line in text.splitlines() if line and not line.startswith("#")]
    # tmpfiles.d(5): type, path, mode, user, group, age, argument. 0730: the agent's group may create and rename
    # files (write and search), not list the directory; no age, so systemd-tmpfiles --clean leaves a request alone.
    assert line.split() == ["d", gpu_health.REPAIR_DIR, "0730", "root", "65534", "-", "-"]
    tmpfiles = shutil.which("systemd-tmpfiles")
    if tmpfiles is None or os.geteuid() != 0:
        return  # the line's own fields are checked; making the directory needs root (chown)
    conf = tmp_path / "dlinfra-gpu-repair.conf"
    conf.write_text(text)
    root = tmp_path / "root"
    root.mkdir()
    result = run(tmpfiles, f"--root={root}", "--create", str(conf))
    assert result.returncode == 0, result.stderr
    made = (root / gpu_health.REPAIR_DIR.lstrip("/")).stat()
    assert (made.st_mode & 0o7777, made.st_uid, made.st_gid) == (0o730, 0, 65534)
