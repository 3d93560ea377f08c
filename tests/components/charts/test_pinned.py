"""The pinned charts (dlinfra/data/addons.yaml): every add-on is a release of its pinned chart, in every region."""

from __future__ import annotations

import re

import pytest

from components.charts import pinned
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import RELEASE, Stack, regional_stacks


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_every_addon_is_a_pinned_release(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    expected = set(pinned.ADDONS)
    if not fleet.sites_of(stack.role.environment, stack.role.region):
        expected.remove("cilium")  # hybrid nodes need a CNI only where sites join
    if not any(p.efa for p in fleet.pools_in(stack.role.environment, stack.role.region).values()):
        expected.remove("aws-efa-k8s-device-plugin")  # only where EFA pools run
    releases = {r.inputs["name"]: r for r in stack.of_type(RELEASE)}
    assert set(releases) == expected
    for addon, record in releases.items():
        spec = pinned.load_addons()[addon]
        inputs = record.inputs
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", inputs["version"]) and inputs["version"] == spec.version
        assert inputs["chart"] == spec.chart and inputs["namespace"] == spec.namespace
        if spec.repository:
            assert inputs["repositoryOpts"] == {"repo": spec.repository}
        else:
            assert inputs["chart"].startswith("oci://") and "repositoryOpts" not in inputs
        assert inputs["atomic"] is True


def test_addons_file_pins_exact_versions_from_https_or_oci() -> None:
    for addon, spec in pinned.load_addons().items():
        assert spec.chart.startswith("oci://") or (spec.repository or "").startswith("https://"), addon
        assert spec.verified
