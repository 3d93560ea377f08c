#!/usr/bin/env bash
set -o errexit -o nounset -o pipefail
# GPU image only: the NVIDIA stack matches the version the AMI's tags claim, and its kernel modules
# exist for the kernel the image boots.

case "${DLINFRA_VARIANT:?set by node.pkr.hcl}" in
  gpu) ;;
  *) echo "30-validate-gpu: nothing to do for variant ${DLINFRA_VARIANT}"; exit 0 ;;
esac

: "${NVIDIA_DRIVER_VERSION:?the gpu variant needs nvidia_driver_version}"
branch="${NVIDIA_DRIVER_VERSION%%.*}"

fail() {
  echo "30-validate-gpu: $*" >&2
  exit 1
}

version_of() {
  dpkg-query --show --showformat='${Version}' "$1" 2>/dev/null || true
}

for package in "nvidia-driver-${branch}-open" "nvidia-fabricmanager-${branch}"; do
  case "$(version_of "${package}")" in
    "${NVIDIA_DRIVER_VERSION}"-*) ;;
    *) fail "${package} is '$(version_of "${package}")', want ${NVIDIA_DRIVER_VERSION}" ;;
  esac
done

kernel=$(uname -r)
dkms status -k "${kernel}" | grep --quiet "^nvidia/${NVIDIA_DRIVER_VERSION}.*: installed" ||
  fail "DKMS has no nvidia ${NVIDIA_DRIVER_VERSION} module for kernel ${kernel}"

command -v nvidia-ctk >/dev/null || fail "nvidia-container-toolkit is missing"
grep --quiet 'default_runtime_name = "nvidia"' /etc/containerd/config.toml ||
  fail "containerd does not default to the nvidia runtime"
[[ -x /usr/local/libexec/dlinfra/needs-fabricmanager ]] || fail "Fabric Manager gate script is missing"
grep --quiet '^# EFA installer version:' /opt/amazon/efa_installed_packages || fail "EFA is not installed"
systemctl is-enabled --quiet nvidia-dcgm || fail "nvidia-dcgm is not enabled"

# The GPU burn-in: the check, its Python environment and the unit that runs it at every boot, and the watch after it.
# The build machine has no GPU, so the check itself runs only as far as NVML: it must start, read its expectation and
# report that it could not judge this machine (exit 2), and the watch, one poll of it, must write a health file that
# says so ("unreadable"), which proves the script and its imports work in the image.
check_python=/opt/dlinfra/gpu-check/bin/python
check_script=/usr/local/libexec/dlinfra/gpu_check.py
"${check_python}" -c 'import pynvml, torch' || fail "the GPU check's environment lacks nvidia-ml-py or PyTorch"
cuda=$("${check_python}" -c 'import torch; print(torch.version.cuda or "")')
[[ "${cuda%%.*}" == 12 ]] || fail "PyTorch is built for CUDA '${cuda}'; the ${branch} driver runs CUDA 12"
systemctl is-enabled --quiet dlinfra-gpu-check.service || fail "dlinfra-gpu-check is not enabled"
systemctl is-enabled --quiet dlinfra-gpu-watch.service || fail "dlinfra-gpu-watch is not enabled"
[[ -d /var/lib/dlinfra/gpu-check ]] || fail "the GPU check's report directory is missing"
# The repair (dlinfra_gpu::gpu_repair): the path unit enabled, the unit it starts, and the request directory that
# systemd-tmpfiles makes at every boot, as it stands on this one: the burn-in agent (gid 65534) may only add to it.
systemctl cat dlinfra-gpu-repair.service >/dev/null 2>&1 || fail "dlinfra-gpu-repair.service is not installed"
systemctl cat dlinfra-gpu-repair.path >/dev/null 2>&1 || fail "dlinfra-gpu-repair.path is not installed"
systemctl is-enabled --quiet dlinfra-gpu-repair.path || fail "dlinfra-gpu-repair.path is not enabled"
grep --quiet '^d /run/dlinfra/gpu-repair 0730 root 65534 ' /etc/tmpfiles.d/dlinfra-gpu-repair.conf ||
  fail "no tmpfiles entry for the GPU repair's request directory"
repair_dir=$(stat --format='%a %U %g' /run/dlinfra/gpu-repair 2>/dev/null) || repair_dir=missing
[[ "${repair_dir}" == "730 root 65534" ]] || fail "/run/dlinfra/gpu-repair is '${repair_dir}', want '730 root 65534'"
# The repair, as far as it goes without an approval: it refuses a request of another action, and removes it.
request=$(mktemp)
echo '{"action": "validate"}' >"${request}"
repair_status=0
"${check_python}" "${check_script}" repair "${request}" 2>/dev/null || repair_status=$?
[[ "${repair_status}" == 2 && ! -e "${request}" ]] ||
  fail "the GPU repair exited ${repair_status} on a request it must refuse; want 2, the request removed"
if ! nvidia-smi --list-gpus >/dev/null 2>&1; then
  expectation=$(mktemp)
  health=$(mktemp -d)/health.json
  # A whole expectation (the Xid catalog too), so that both get past it to NVML.
  echo '{"gpu_count": 1, "products": ["none"], "memory_health": "row_remap", "failing_xids": {}}' >"${expectation}"
  status=0
  "${check_python}" "${check_script}" "${expectation}" >/dev/null || status=$?
  watch_status=0
  "${check_python}" "${check_script}" watch "${expectation}" --health "${health}" --once >/dev/null || watch_status=$?
  watched=$("${check_python}" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "${health}") ||
    watched=none
  rm -rf "${expectation}" "$(dirname "${health}")"
  [[ "${status}" == 2 ]] || fail "the GPU check exited ${status} on a machine without GPUs; want 2 (not judged)"
  [[ "${watch_status}" == 2 && "${watched}" == unreadable ]] ||
    fail "the GPU watch exited ${watch_status}, health '${watched}', on a machine without GPUs; want 2, 'unreadable'"
fi
