"""dlinfra.checks.chef catches each kind of defect it claims to, in broken copies of chef/."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from dlinfra.checks.chef import Finding, check

CHEF = Path(__file__).resolve().parents[2] / "chef"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A private copy of chef/ to break."""
    copy = tmp_path / "chef"
    shutil.copytree(CHEF, copy)
    return copy


def edit(path: Path, change: Callable[[str], str]) -> None:
    before = path.read_text()
    after = change(before)
    assert after != before, f"the edit did not change {path}"
    path.write_text(after)


def messages(findings: list[Finding]) -> list[str]:
    return [str(f) for f in findings]


def only(findings: list[Finding]) -> str:
    assert len(findings) == 1, messages(findings)
    return str(findings[0])


def test_copy_is_clean(repo: Path) -> None:
    assert check(repo) == []


# -- attribute reads ----------------------------------------------------------------------------------


def test_recipe_reads_attribute_without_default(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_base/recipes/chrony.rb"
    edit(
        recipe,
        lambda t: t.replace("node['dlinfra_base']['chrony']['pools']", "node['dlinfra_base']['chrony']['pool']"),
    )
    assert only(check(repo)) == (
        "cookbooks/dlinfra_base/recipes/chrony.rb:9: "
        "node['dlinfra_base']['chrony']['pool'] has no default in any cookbook's attributes/"
    )


def test_read_through_a_local_alias(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_hybrid/recipes/nodeadm.rb"
    edit(recipe, lambda t: t.replace("hybrid['nodeadm']['checksum'] if", "hybrid['nodeadm']['sha'] if"))
    assert "node['dlinfra_hybrid']['nodeadm']['sha'] has no default" in only(check(repo))


def test_library_reads_attribute_without_default(repo: Path) -> None:
    library = repo / "cookbooks/dlinfra_gateway/libraries/helpers.rb"
    edit(
        library,
        lambda t: t.replace("node['dlinfra_gateway']['routing']", "node['dlinfra_gateway']['routeing']", 1),
    )
    assert "libraries/helpers.rb" in only(check(repo))


def test_template_reads_attribute_without_default(repo: Path) -> None:
    template = repo / "cookbooks/dlinfra_gpu/templates/fabricmanager-nvswitch-only.conf.erb"
    edit(template, lambda t: t + "# <%= node['dlinfra_gpu']['fabricmanager']['mode'] %>\n")
    assert "fabricmanager-nvswitch-only.conf.erb:4: node['dlinfra_gpu']['fabricmanager']['mode']" in only(check(repo))


def test_removed_default_is_caught_where_it_is_read(repo: Path) -> None:
    attributes = repo / "cookbooks/dlinfra_efa/attributes/default.rb"
    edit(attributes, lambda t: t.replace("default['dlinfra_efa']['containerd_memlock_unlimited'] = true\n", ""))
    found = messages(check(repo))
    assert len(found) == 2 and all("['containerd_memlock_unlimited'] has no default" in f for f in found)


def test_ohai_reads_comments_and_hash_defaults_are_accepted(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_base/recipes/default.rb"
    edit(
        recipe,
        lambda t: (
            t
            + "log node['platform_version']\n"
            + "# node['dlinfra_base']['only_in_a_comment']\n"
            + "log 'x' unless node['dlinfra_base']['sysctl']['kernel.pid_max']\n"
            + "log \"# node['dlinfra_base']['in_a_string']\"\n"
        ),
    )
    findings = messages(check(repo))
    # Ohai keys, comments and keys inside a hash default pass. The checker reads text, not Ruby, so
    # node[...] written inside a plain string literal is flagged too: the safe side to err on.
    assert len(findings) == 1 and "in_a_string" in findings[0]


# -- templates and cookbook files ---------------------------------------------------------------------------


def test_missing_template(repo: Path) -> None:
    (repo / "cookbooks/dlinfra_base/templates/chrony.conf.erb").unlink()
    assert only(check(repo)) == (
        "cookbooks/dlinfra_base/recipes/chrony.rb:5: "
        "template '/etc/chrony/chrony.conf': dlinfra_base/templates/chrony.conf.erb does not exist"
    )


def test_misnamed_template_source(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_gateway/recipes/frr.rb"
    edit(recipe, lambda t: t.replace("source 'frr-daemons.erb'", "source 'frr_daemons.erb'"))
    assert "dlinfra_gateway/templates/frr_daemons.erb does not exist" in only(check(repo))


def test_template_without_source_uses_the_file_name(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_efa/recipes/default.rb"
    edit(recipe, lambda t: t.replace("  source 'containerd-memlock.conf.erb'\n", ""))
    assert "dlinfra_efa/templates/20-dlinfra-efa-memlock.conf.erb does not exist" in only(check(repo))


def test_template_variable_not_passed(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_base/recipes/chrony.rb"
    edit(recipe, lambda t: t.replace(",\n    pools: node['dlinfra_base']['chrony']['pools']", ""))
    assert "chrony.conf.erb uses @pools but variables() does not pass it" in only(check(repo))


def test_missing_cookbook_file(repo: Path) -> None:
    for path in (repo / "test/cookbooks/dlinfra_test/files/site").iterdir():
        path.unlink()
    assert "dlinfra_test/files/site/#{name} does not exist" in only(check(repo))


# -- include_recipe ------------------------------------------------------------------------------------


def test_include_of_missing_recipe(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_gpu/recipes/default.rb"
    edit(recipe, lambda t: t.replace("dlinfra_gpu::dcgm", "dlinfra_gpu::dcgm_exporter"))
    assert only(check(repo)) == (
        "cookbooks/dlinfra_gpu/recipes/default.rb:6: "
        "include_recipe 'dlinfra_gpu::dcgm_exporter': dlinfra_gpu has no recipes/dcgm_exporter.rb"
    )


def test_include_of_unknown_cookbook(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_hybrid/recipes/default.rb"
    edit(recipe, lambda t: t + "include_recipe 'nfs::client4'\n")
    assert "include_recipe 'nfs::client4': no cookbook 'nfs'" in only(check(repo))


def test_include_without_depends(repo: Path) -> None:
    recipe = repo / "cookbooks/dlinfra_efa/recipes/default.rb"
    edit(recipe, lambda t: "include_recipe 'dlinfra_base::containerd'\n" + t)
    assert "add `depends 'dlinfra_base'` to dlinfra_efa/metadata.rb" in only(check(repo))


# -- run lists -------------------------------------------------------------------------------------------


def test_role_names_missing_recipe(repo: Path) -> None:
    role = repo / "roles/gpu-node.json"
    edit(role, lambda t: t.replace('"recipe[dlinfra_efa]"', '"recipe[dlinfra_efa::driver]"'))
    assert only(check(repo)) == (
        "roles/gpu-node.json:11: run list entry 'recipe[dlinfra_efa::driver]': dlinfra_efa has no recipes/driver.rb"
    )


def test_node_names_missing_role(repo: Path) -> None:
    node = repo / "nodes/site-gateway.json"
    edit(node, lambda t: t.replace("role[site-gateway]", "role[gateway]"))
    assert "nodes/site-gateway.json:2: run list entry 'role[gateway]': no roles/gateway.json" in only(check(repo))


def test_kitchen_suite_names_unknown_cookbook(repo: Path) -> None:
    kitchen = repo / "kitchen.yml"
    edit(kitchen, lambda t: t.replace("recipe[dlinfra_test::wrapper]", "recipe[dlinfra_tests::wrapper]"))
    assert "kitchen.yml:" in only(check(repo)) and "no cookbook 'dlinfra_tests'" in only(check(repo))


def test_malformed_run_list_entry(repo: Path) -> None:
    role = repo / "roles/cpu-node.json"
    edit(role, lambda t: t.replace('"role[node-base]"', '"role:node-base"'))
    assert "'role:node-base' is neither recipe[...] nor role[...]" in only(check(repo))


def test_bare_recipe_entries_are_understood(repo: Path) -> None:
    node = repo / "nodes/cpu-node.json"
    data = json.loads(node.read_text())
    data["run_list"] = ["dlinfra_base", "dlinfra_base::kubelet", "recipe[dlinfra_base::kubelet@0.1.0]"]
    node.write_text(json.dumps(data))
    assert check(repo) == []


def test_role_cycle(repo: Path) -> None:
    role = repo / "roles/node-base.json"
    edit(role, lambda t: t.replace('"recipe[dlinfra_base]",', '"recipe[dlinfra_base]",\n    "role[gpu-node]",'))
    assert only(check(repo)) == "roles/cpu-node.json:1: role cycle: cpu-node -> node-base -> gpu-node -> cpu-node"


def test_role_name_differs_from_file(repo: Path) -> None:
    role = repo / "roles/site-gateway.json"
    edit(role, lambda t: t.replace('"name": "site-gateway"', '"name": "gateway"'))
    assert "role name 'gateway' differs from file name 'site-gateway'" in only(check(repo))


def test_invalid_json(repo: Path) -> None:
    role = repo / "roles/cpu-node.json"
    edit(role, lambda t: t.replace('"chef_type": "role",', '"chef_type": "role"'))
    assert only(check(repo)).startswith("roles/cpu-node.json:6: not valid JSON")


# -- cookbooks -------------------------------------------------------------------------------------------


def test_metadata_name_differs_from_directory(repo: Path) -> None:
    metadata = repo / "cookbooks/dlinfra_efa/metadata.rb"
    edit(metadata, lambda t: t.replace("name 'dlinfra_efa'", "name 'dlinfra-efa'"))
    found = messages(check(repo))
    assert "cookbooks/dlinfra_efa/metadata.rb:1: metadata name 'dlinfra-efa' differs from directory" in found[0]


def test_node_file_sets_unknown_attribute(repo: Path) -> None:
    node = repo / "nodes/site-gateway.json"
    edit(node, lambda t: t.replace('"routing": "bgp"', '"routeing": "bgp"'))
    assert only(check(repo)) == (
        "nodes/site-gateway.json:7: sets node['dlinfra_gateway']['routeing'], "
        "which no cookbook's attributes/ defines (misspelt?)"
    )


def test_role_attributes_are_checked_and_hash_defaults_accept_new_keys(repo: Path) -> None:
    role = repo / "roles/gpu-node.json"
    data = json.loads(role.read_text())
    data["default_attributes"] = {
        "dlinfra_base": {"sysctl": {"vm.swappiness": 1}},  # sysctl defaults to a hash: any key may join it
        "dlinfra_gpu": {"driver": {"verison": "570.172.08"}},
    }
    role.write_text(json.dumps(data, indent=2))
    assert "sets node['dlinfra_gpu']['driver']['verison']" in only(check(repo))
