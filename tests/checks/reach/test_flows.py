"""The user's flows file: its flows become intents that can fail, and a bad file names the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra.checks.reach import check
from dlinfra.errors import DlinfraError
from tests.checks.reach.test_reference import plans
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


def test_a_flows_file_adds_intents_and_they_can_fail(tmp_path: Path) -> None:
    flows = tmp_path / "flows.yaml"
    flows.write_text(
        "flows:\n"
        "  - name: grafana-from-sjc1\n"
        "    from: {site: sjc1}\n"
        "    to: {pool: cpu, environment: prod, region: us-west-2}\n"
        "    ports: [3000]\n"
        "  - name: no-staging-to-prod-api\n"
        "    from: {pool: cpu, environment: staging}\n"
        "    to: {control_plane: true, environment: prod}\n"
        "    ports: [443]\n"
        "    expect: deny\n"
        "  - name: internet-to-efs\n"
        "    from: {internet: true}\n"
        "    to: {efs: true, environment: prod}\n"
        "    ports: [2049]\n"
        "    expect: allow\n"
    )
    result = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans(), flows)
    user = {i.id for i in result.intents if i.family == "user"}
    assert user == {"user/grafana-from-sjc1", "user/no-staging-to-prod-api", "user/internet-to-efs"}
    failing = {f.intent.id for f in result.failures}
    assert failing == {"user/internet-to-efs"}  # the internet reaches no mount target: the user's wish fails


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (
            "flows:\n  - name: x\n    from: {pool: cpu}\n    to: {pool: cpu}\n    colour: red\n",
            "flows.0.colour",
            "Extra inputs",
        ),
        (
            "flows:\n  - name: x\n    from: {pool: cpu, site: sjc1}\n    to: {pool: cpu}\n",
            "flows.0.from",
            "exactly one of",
        ),
        ("flows:\n  - name: x\n    from: {pool: gpu-huge}\n    to: {pool: cpu}\n", "flows.0.from", "selects nothing"),
        ("flows:\n  - name: x\n    from: {site: nowhere}\n    to: {pool: cpu}\n", "flows.0.from.site", "unknown site"),
        (
            "flows:\n  - name: x\n    from: {pool: cpu}\n    to: {pool: cpu}\n    ports: [70000]\n",
            "flows.0.ports",
            "not in 1-65535",
        ),
    ],
)
def test_bad_flows_files_name_the_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    flows = tmp_path / "flows.yaml"
    flows.write_text(text)
    with pytest.raises(DlinfraError) as caught:
        check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans(), flows)
    assert caught.value.file == str(flows) and caught.value.key == key
    assert message in str(caught.value)
