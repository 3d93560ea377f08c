#!/usr/bin/env bash
set -o errexit -o nounset -o pipefail
# Brings Canonical's image up to date first, so everything later is built against the final kernel.

case "${DLINFRA_VARIANT:?set by node.pkr.hcl}" in
  cpu | gpu) ;;
  *) echo "00-prepare: nothing to do for variant ${DLINFRA_VARIANT}"; exit 0 ;;
esac

# First boot: cloud-init may still hold the apt lock.
cloud-init status --wait >/dev/null

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get --yes --option Dpkg::Options::=--force-confold dist-upgrade
apt-get --yes autoremove --purge
