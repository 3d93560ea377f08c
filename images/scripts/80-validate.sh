#!/usr/bin/env bash
set -o errexit -o nounset -o pipefail
# Every image: what a node needs to join its cluster is installed, pinned and enabled.

case "${DLINFRA_VARIANT:?set by node.pkr.hcl}" in
  cpu | gpu) ;;
  *) echo "80-validate: nothing to do for variant ${DLINFRA_VARIANT}"; exit 0 ;;
esac

: "${KUBERNETES_VERSION:?set by node.pkr.hcl}"

fail() {
  echo "80-validate: $*" >&2
  exit 1
}

kubelet --version | grep --quiet "v${KUBERNETES_VERSION}\." ||
  fail "kubelet is $(kubelet --version), want ${KUBERNETES_VERSION}.x"
containerd config dump >/dev/null || fail "/etc/containerd/config.toml does not parse"
systemctl is-enabled --quiet containerd || fail "containerd is not enabled"
systemctl is-enabled --quiet kubelet || fail "kubelet is not enabled"
# The node pool's user data runs the join script; it needs the AWS CLI and the ECR credential provider.
[[ -x /usr/local/sbin/dlinfra-node-join ]] || fail "dlinfra-node-join is missing"
[[ -x /snap/bin/aws ]] || fail "the AWS CLI is missing"
[[ -x /usr/local/lib/dlinfra/credential-providers/ecr-credential-provider ]] ||
  fail "the ECR credential provider is missing"
[[ "$(wc -l </proc/swaps)" -le 1 ]] || fail "swap is on"
grep --quiet '^br_netfilter$' /etc/modules-load.d/dlinfra.conf || fail "br_netfilter is not loaded at boot"
if [[ "$(dpkg-query --show --showformat='${db:Status-Status}' unattended-upgrades 2>/dev/null)" == installed ]]; then
  fail "unattended-upgrades is installed: kernel updates would strand the DKMS-built modules"
fi

if [[ "${DLINFRA_VARIANT}" == cpu ]] && dpkg-query --show 'nvidia-*' 2>/dev/null | grep --quiet .; then
  fail "the cpu image carries NVIDIA packages"
fi
