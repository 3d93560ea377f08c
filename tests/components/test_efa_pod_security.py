"""A training pod that requests EFA is admitted in a team namespace, and can land on an EFA pool.

The pod (tests/fixtures/k8s/efa-training-pod.yaml) is checked against the Pod Security level the declared team
namespaces enforce, with the Pod Security Standards checks of tests/components/_pod_security.py, and against
the node image's arrangement that lets it go without IPC_LOCK: containerd, and so every container, runs with
an unlimited memlock limit, under which EFA registers (pins) memory.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components import nodepool
from components.charts.efa import EFA_RESOURCE
from dlinfra.model import instances
from dlinfra.model.naming import Names
from tests import reference as ref
from tests.components import _pod_security as pss
from tests.conftest import ROOT

POD = Path(__file__).parent.parent / "fixtures" / "k8s" / "efa-training-pod.yaml"
STACK = "prod-us-west-2"
ENFORCE = "pod-security.kubernetes.io/enforce"
EFA_CHEF = ROOT / "chef" / "cookbooks" / "dlinfra_efa"


@functools.cache
def pod() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(POD.read_text())
    return manifest


def _pod() -> dict[str, Any]:
    return copy.deepcopy(pod())


def namespace_labels(stack: str = STACK) -> dict[str, dict[str, str]]:
    """Team namespace -> its labels, as the stack declares them."""
    return {
        r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"]
        for r in ref.of_type(ref.runs()[f"{stack}-k8s"], "kubernetes:core/v1:Namespace")  # the in-cluster stack
    }


def test_the_pod_is_a_valid_manifest() -> None:
    env = STACK.split("-", 1)[0]
    kubernetes_validate.validate(pod(), ref.fleet().environments[env].kubernetes.version, strict=True)


def test_team_namespaces_enforce_a_level_that_admits_the_efa_training_pod() -> None:
    labels = namespace_labels()
    assert set(labels) == {ref.fleet().team_namespace(t) for t in ref.fleet().teams}
    assert pod()["metadata"]["namespace"] in labels
    for namespace, namespace_labels_ in labels.items():
        level = namespace_labels_.get(ENFORCE)
        # Enforced, and not by opening the namespace up: privileged admits anything, host access included.
        assert level in ("baseline", "restricted"), f"{namespace} enforces {level!r}"
        assert pss.violations(pod(), level) == [], namespace


def test_the_pod_asks_for_gpus_and_efa_and_nothing_baseline_forbids() -> None:
    (container,) = pod()["spec"]["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    for resource in ("nvidia.com/gpu", EFA_RESOURCE):
        assert int(requests[resource]) > 0 and requests[resource] == limits[resource]
    context = container.get("securityContext") or {}
    assert not context.get("privileged") and not (context.get("capabilities") or {}).get("add")
    assert not any(pod()["spec"].get(f) for f in ("hostNetwork", "hostIPC", "hostPID"))
    assert not any("hostPath" in v for v in pod()["spec"]["volumes"])


def test_no_ipc_lock_because_the_gpu_image_lifts_containerds_memlock_limit() -> None:
    """Revert the containerd drop-in (or take dlinfra_efa off the GPU image) and the pod needs IPC_LOCK."""
    attributes = (EFA_CHEF / "attributes" / "default.rb").read_text()
    assert re.search(r"^default\['dlinfra_efa'\]\['containerd_memlock_unlimited'\] = true$", attributes, re.M)
    recipe = (EFA_CHEF / "recipes" / "default.rb").read_text()
    drop_in = re.search(
        r"template '(/etc/systemd/system/containerd\.service\.d/[^']+\.conf)' do\n(.*?)\nend", recipe, re.S
    )
    assert drop_in, "dlinfra_efa no longer writes a containerd drop-in"
    source = re.search(r"source '([^']+)'", drop_in.group(2))
    assert source and "containerd_memlock_unlimited" in drop_in.group(2)
    assert "notifies :restart, 'service[dlinfra_efa containerd]'" in drop_in.group(2)
    template = (EFA_CHEF / "templates" / source.group(1)).read_text()
    assert re.search(r"^\[Service\]\nLimitMEMLOCK=infinity$", template, re.M)
    # The GPU image converges the role that runs it.
    role = json.loads((ROOT / "chef" / "roles" / "gpu-node.json").read_text())
    assert "recipe[dlinfra_efa]" in role["run_list"]
    assert re.search(r'^chef_role\s*=\s*"gpu-node"$', (ROOT / "images/variables/gpu.pkrvars.hcl").read_text(), re.M)


def test_the_pod_fits_an_efa_pool_where_the_device_plugin_runs() -> None:
    """It selects, tolerates and fits the nodes of an EFA pool of the stack, where the EFA plugin is deployed."""
    env, region = STACK.split("-", 1)
    spec = pod()["spec"]
    (container,) = spec["containers"]
    requests = container["resources"]["requests"]
    matches = []
    for name, pool in ref.fleet().pools_in(env, region).items():
        args = nodepool.NodePoolArgs(
            names=Names("dlinfra", env, region), pool=name, kind=pool.kind, cluster_name="c", ami_id="ami-0",
            instance_types=pool.instance_types, subnet_ids={"a": "s"}, vpc_id="vpc-0", efa=pool.efa,
            taints=[(t.key, t.value, t.effect) for t in pool.taints], cluster_dns=("169.254.20.10",),
        )  # fmt: skip
        itype = instances.lookup(pool.instance_types[0])
        labels = nodepool.node_labels(args) | {"node.kubernetes.io/instance-type": itype.name}  # set by kubelet
        if not all(labels.get(k) == v for k, v in spec["nodeSelector"].items()):
            continue
        assert all(
            any(t.get("key") == key and t.get("effect") == effect for t in spec["tolerations"])
            for key, _, effect in args.taints
        ), name
        assert int(requests["nvidia.com/gpu"]) <= itype.gpus and int(requests[EFA_RESOURCE]) <= itype.efa_interfaces
        matches.append(name)
    assert matches, "no EFA pool of the stack matches the pod's node selector"
    release = ref.named(ref.runs()[f"{STACK}-k8s"], "platform-aws-efa-k8s-device-plugin")
    assert release.inputs["values"]["nodeSelector"].items() <= pod()["spec"]["nodeSelector"].items()


# The checks themselves: what the namespaces would reject, so the passing verdicts above mean something.


def _aws_sample() -> dict[str, Any]:
    """The AWS guide's worker as written: the node's /dev/shm as a hostPath."""
    manifest = _pod()
    manifest["spec"]["volumes"] = [{"name": "shm", "hostPath": {"path": "/dev/shm"}}]
    return manifest


def _with_ipc_lock() -> dict[str, Any]:
    manifest = _pod()
    manifest["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return manifest


def _privileged() -> dict[str, Any]:
    manifest = _pod()
    manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return manifest


def _host_network() -> dict[str, Any]:
    manifest = _pod()
    manifest["spec"]["hostNetwork"] = True
    return manifest


@pytest.mark.parametrize(
    ("make", "control"),
    [
        (_aws_sample, "HostPath Volumes"),
        (_with_ipc_lock, "Capabilities: containers[worker] adds IPC_LOCK"),
        (_privileged, "Privileged Containers"),
        (_host_network, "Host Namespaces: spec.hostNetwork"),
    ],
)
def test_baseline_rejects_what_the_pod_avoids(make: Any, control: str) -> None:
    found = pss.violations(make(), "baseline")
    assert len(found) == 1 and found[0].startswith(control), found
    assert pss.violations(make(), "privileged") == []


def test_restricted_would_reject_the_pod_as_teams_write_it() -> None:
    """Why team namespaces enforce baseline and only warn about restricted: training images run as root."""
    found = pss.violations(pod(), "restricted")
    assert any(f.startswith("Running as Non-root") for f in found)
    assert any(f.startswith("Capabilities: containers[worker] does not drop ALL") for f in found)


@pytest.mark.parametrize(
    ("change", "control"),
    [
        ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, "Sysctls"),
        ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "Seccomp"),
        ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "SELinux"),
        ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "HostProcess"),
        ({"hostPID": True}, "Host Namespaces"),
        ({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "AppArmor"),
    ],
)
def test_baseline_pod_level_controls(change: dict[str, Any], control: str) -> None:
    manifest = _pod()
    manifest["spec"].update(change)
    found = pss.violations(manifest, "baseline")
    assert len(found) == 1 and found[0].startswith(control), found


def test_baseline_container_level_controls() -> None:
    manifest = _pod()
    worker = manifest["spec"]["containers"][0]
    worker["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    worker["securityContext"] = {"procMount": "Unmasked", "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}
    manifest["metadata"]["annotations"] = {f"{pss.APPARMOR_ANNOTATION}worker": "unconfined"}
    found = " | ".join(pss.violations(manifest, "baseline"))
    for control in ("Host Ports", "/proc Mount Type", "adds SYS_ADMIN", "AppArmor: annotation"):
        assert control in found
    assert "NET_BIND_SERVICE" not in found
    with pytest.raises(ValueError, match="unknown Pod Security level"):
        pss.violations(manifest, "strict")
