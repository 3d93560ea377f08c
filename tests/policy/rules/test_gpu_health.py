"""The GPU burn-in rule, on the reference fleet's own plans (a regional stack with GPU pools and its in-cluster stack)
and on copies with one piece of the burn-in taken out."""

from __future__ import annotations

import base64
import copy
import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks.plans import Plan
from dlinfra.model import gpu_health
from policy.dlinfra_policy.rules.core import Resource
from policy.dlinfra_policy.rules.gpu_health import gpu_node_model_labels, gpu_nodes_burn_in, gpu_nodes_repaired
from tests import reference
from tests.policy.rules._resources import CTX, pass_and_fail

BURN_IN = "{}={}:{}".format(*gpu_health.BURN_IN_TAINT)


@functools.cache
def _stack(name: str) -> tuple[Resource, ...]:
    data = reference.runs()[name].plan(reference.fleet().project)
    return tuple(Plan(Path(f"{name}.json"), name, data).rule_resources())


def _regional() -> list[Resource]:
    return list(_stack("prod-us-west-2"))


def _in_cluster() -> list[Resource]:
    return list(_stack("prod-us-west-2-k8s"))


def _edit(
    resources: list[Resource], match: Callable[[Resource], bool], change: Callable[[dict[str, Any]], None]
) -> list[Resource]:
    out = []
    for r in resources:
        if match(r):
            inputs = copy.deepcopy(dict(r.inputs))
            change(inputs)
            r = replace(r, inputs=inputs)
        out.append(r)
    return out


def _user_data(edit: Callable[[str], str]) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        inputs["userData"] = base64.b64encode(edit(base64.b64decode(inputs["userData"]).decode()).encode()).decode()

    return change


def _named(type_suffix: str, name: str) -> Callable[[Resource], bool]:
    return lambda r: r.type.endswith(type_suffix) and r.inputs.get("metadata", {}).get("name") == name


def _values(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda inputs: edit(inputs["values"])


def _kueue_timeout(timeout: str) -> Callable[[dict[str, Any]], None]:
    def change(values: dict[str, Any]) -> None:
        import yaml

        holder = values["managerConfig"]
        config = yaml.safe_load(holder["controllerManagerConfigYaml"])
        config["waitForPodsReady"]["timeout"] = timeout
        holder["controllerManagerConfigYaml"] = yaml.safe_dump(config)

    return change


LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
RELEASE = "kubernetes:helm.sh/v3:Release"


def _gpu_template(r: Resource) -> bool:
    return r.type == LAUNCH_TEMPLATE and BURN_IN in base64.b64decode(r.inputs["userData"]).decode()


def _chart(name: str) -> Callable[[Resource], bool]:
    return lambda r: r.type == RELEASE and str(r.inputs.get("chart", "")).endswith(name)


def test_the_reference_plans_pass() -> None:
    assert [r for r in _regional() if _gpu_template(r)]  # the fixture has GPU pools
    assert gpu_nodes_burn_in(_regional(), CTX) == []
    assert gpu_nodes_burn_in(_in_cluster(), CTX) == []


MUTATIONS = [
    pytest.param(
        _regional,
        _gpu_template,
        _user_data(lambda text: text.replace(BURN_IN, "")),
        "must register with the burn-in taint",
        id="user-data-without-the-taint",
    ),
    pytest.param(
        _regional,
        _gpu_template,
        _user_data(lambda text: text.replace(gpu_health.CHECK_UNIT, "nothing.service")),
        "nor starts",
        id="user-data-without-the-check",
    ),
    pytest.param(
        _regional,
        lambda r: r.type == "aws:autoscaling/group:Group" and "train" in r.name,
        lambda inputs: inputs["tags"].append(
            {
                "key": f"k8s.io/cluster-autoscaler/node-template/taint/{gpu_health.BURN_IN_TAINT[0]}",
                "value": "pending:NoSchedule",
                "propagateAtLaunch": False,
            }
        ),
        "the scale-from-zero template carries the burn-in taint",
        id="burn-in-taint-in-the-node-template",
    ),
    *(
        pytest.param(
            _in_cluster,
            _chart("cluster-autoscaler"),
            _values(lambda values, flag=flag: values["extraArgs"].pop(flag)),
            problem,
            id=f"autoscaler-without-{flag}",
        )
        for flag, problem in (
            ("startup-taint", "dlinfra.io/gpu-burn-in is not a startup taint"),
            ("status-taint_unhealthy", "dlinfra.io/gpu-unhealthy is not a status taint"),
            ("status-taint_site", "dlinfra.io/gpu-burn-in-site is not a status taint"),
        )
    ),
    pytest.param(
        _in_cluster,
        _named(":DaemonSet", "gpu-burn-in"),
        lambda inputs: inputs["spec"]["template"]["spec"].update(tolerations=[]),
        "no DaemonSet gpu-burn-in tolerating",
        id="agent-not-tolerating-the-taint",
    ),
    pytest.param(
        _in_cluster,
        _named(":ValidatingAdmissionPolicyBinding", "dlinfra-gpu-burn-in-own-node"),
        lambda inputs: inputs["spec"].update(validationActions=["Audit"]),
        "not bound with Deny",
        id="own-node-policy-only-audited",
    ),
    pytest.param(
        _in_cluster,
        _chart("kueue"),
        _values(_kueue_timeout("30m")),
        "shorter than the autoscaler's max-node-provision-time plus the GPU burn-in",
        id="kueue-wait-shorter-than-provision-and-burn-in",
    ),
]


@pytest.mark.parametrize(("stack", "match", "change", "problem"), MUTATIONS)
def test_each_piece_taken_out_is_named(
    stack: Callable[[], list[Resource]],
    match: Callable[[Resource], bool],
    change: Callable[[dict[str, Any]], None],
    problem: str,
) -> None:
    _named_by(gpu_nodes_burn_in, stack, match, change, problem)


def _named_by(
    rule: Callable[[list[Resource], Any], list[Any]],
    stack: Callable[[], list[Resource]],
    match: Callable[[Resource], bool],
    change: Callable[[dict[str, Any]], None],
    problem: str,
) -> None:
    """The rule names `problem` once `change` is made to the resources `match` picks in `stack`."""
    resources = stack()
    assert any(match(r) for r in resources), "the mutation matches nothing"
    messages = [v.message for v in rule(_edit(resources, match, change), CTX)]
    assert any(problem in m for m in messages), messages


def test_a_cluster_without_the_agent_is_named() -> None:
    without = [r for r in _in_cluster() if not _named(":DaemonSet", "gpu-burn-in")(r)]
    (violation,) = gpu_nodes_burn_in(without, CTX)
    assert "nothing takes the burn-in taint off" in violation.message


CASES = {
    "gpu-nodes-burn-in": (
        _in_cluster(),
        [r for r in _in_cluster() if not _named(":DaemonSet", "gpu-burn-in")(r)],
    )
}


# gpu-node-model-labels --------------------------------------------------------------------------------------------

ASG = "aws:autoscaling/group:Group"


def _train_group(r: Resource) -> bool:
    return r.type == ASG and "train" in r.name


def _tag(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        (tag,) = [t for t in inputs["tags"] if t["key"] == f"k8s.io/cluster-autoscaler/node-template/label/{key}"]
        tag["value"] = value

    return change


def test_the_reference_plans_label_gpu_nodes_alike_everywhere() -> None:
    assert gpu_node_model_labels(_regional(), CTX) == []
    assert gpu_node_model_labels(_in_cluster(), CTX) == []


LABEL_MUTATIONS = [
    pytest.param(
        _regional,
        _gpu_template,
        _user_data(lambda text: text.replace("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3")),
        "the kubelet would not start",
        id="product-label-with-spaces",
    ),
    pytest.param(
        _regional,
        _gpu_template,
        _user_data(lambda text: text.replace(",dlinfra.io/gpu-model=H100", "")),
        "register without the label dlinfra.io/gpu-model",
        id="no-model-label",
    ),
    pytest.param(
        _regional,
        _train_group,
        _tag("nvidia.com/gpu.product", "H100"),
        "the scale-from-zero template's nvidia.com/gpu.product is 'H100'",
        id="template-label-differs",
    ),
    pytest.param(
        _in_cluster,
        lambda r: r.type.endswith(":ResourceFlavor") and r.inputs["metadata"]["name"] == "pool-train-h100",
        lambda inputs: inputs["spec"]["nodeLabels"].update({"nvidia.com/gpu.product": "H100"}),
        "selects nvidia.com/gpu.product by the short name 'H100'",
        id="flavor-selects-the-short-name-in-nvidia-s-label",
    ),
    pytest.param(
        _in_cluster,
        lambda r: r.type.endswith(":ResourceFlavor") and r.inputs["metadata"]["name"] == "pool-train-h100",
        lambda inputs: inputs["spec"]["nodeLabels"].pop("dlinfra.io/gpu-model"),
        "does not select dlinfra.io/gpu-model",
        id="flavor-without-the-model-label",
    ),
]


@pytest.mark.parametrize(("stack", "match", "change", "problem"), LABEL_MUTATIONS)
def test_each_label_mismatch_is_named(
    stack: Callable[[], list[Resource]],
    match: Callable[[Resource], bool],
    change: Callable[[dict[str, Any]], None],
    problem: str,
) -> None:
    _named_by(gpu_node_model_labels, stack, match, change, problem)


CASES["gpu-node-model-labels"] = (_regional(), _edit(_regional(), _train_group, _tag("dlinfra.io/gpu-model", "A100")))


# gpu-nodes-repaired -----------------------------------------------------------------------------------------------


def _repair_policy(r: Resource) -> bool:
    return r.type == "aws:iam/rolePolicy:RolePolicy" and r.inputs.get("name") == "gpu-repair"


def test_the_repair_s_names_are_the_components() -> None:
    from components import gpu_burn_in, gpu_repair
    from policy.dlinfra_policy.rules import gpu_health as rules

    assert (rules.REPAIR_CONTROLLER, rules.REPAIR_POLICY) == (gpu_repair.NAME, gpu_repair.ANNOTATION_ONLY_POLICY)
    assert rules.AGENT == gpu_burn_in.NAME
    assert gpu_nodes_repaired(_regional(), CTX) == [] and gpu_nodes_repaired(_in_cluster(), CTX) == []


def _any_group(inputs: dict[str, Any]) -> None:
    import json

    document = json.loads(inputs["policy"])
    document["Statement"][0]["Resource"] = "*"
    inputs["policy"] = json.dumps(document)


def _wildcard_action(inputs: dict[str, Any]) -> None:
    import json

    document = json.loads(inputs["policy"])
    document["Statement"][0].update(Action="autoscaling:Set*", Resource="*")
    inputs["policy"] = json.dumps(document)


REPAIR_MUTATIONS = [
    pytest.param(_regional, _repair_policy, _any_group, "only in its own pool's group", id="any-group"),
    pytest.param(_regional, _repair_policy, _wildcard_action, "only in its own pool's group", id="wildcard-action"),
    pytest.param(
        _in_cluster,
        _named(":Deployment", "gpu-repair"),
        lambda inputs: inputs["spec"].update(replicas=2),
        "one replica replaced by Recreate",
        id="two-controllers",
    ),
    pytest.param(
        _in_cluster,
        _named(":ValidatingAdmissionPolicyBinding", "dlinfra-gpu-repair-annotation-only"),
        lambda inputs: inputs["spec"].update(validationActions=["Audit"]),
        "not bound with Deny",
        id="controller-policy-only-audited",
    ),
    pytest.param(
        _in_cluster,
        _named(":DaemonSet", "gpu-burn-in"),
        lambda inputs: inputs["spec"]["template"]["spec"].update(
            volumes=[v for v in inputs["spec"]["template"]["spec"]["volumes"] if v["name"] != "gpu-repair"]
        ),
        "does not mount /run/dlinfra/gpu-repair",
        id="agent-without-the-repair-directory",
    ),
]


@pytest.mark.parametrize(("stack", "match", "change", "problem"), REPAIR_MUTATIONS)
def test_each_piece_of_the_repair_taken_out_is_named(
    stack: Callable[[], list[Resource]],
    match: Callable[[Resource], bool],
    change: Callable[[dict[str, Any]], None],
    problem: str,
) -> None:
    _named_by(gpu_nodes_repaired, stack, match, change, problem)


CASES["gpu-nodes-repaired"] = (
    _in_cluster(),
    [r for r in _in_cluster() if not _named(":Deployment", "gpu-repair")(r)],
)


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)
