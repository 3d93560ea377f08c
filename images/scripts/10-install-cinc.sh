#!/usr/bin/env bash
set -o errexit -o nounset -o pipefail
# Installs Cinc Client, the community build of Chef Infra Client, to run the cookbooks that site
# machines also run. It is removed again by 90-cleanup.sh.

case "${DLINFRA_VARIANT:?set by node.pkr.hcl}" in
  cpu | gpu) ;;
  *) echo "10-install-cinc: nothing to do for variant ${DLINFRA_VARIANT}"; exit 0 ;;
esac

: "${CINC_VERSION:?set by node.pkr.hcl}"

installer=$(mktemp)
trap 'rm -f "${installer}"' EXIT
curl --fail --silent --show-error --location --retry 5 --output "${installer}" https://omnitruck.cinc.sh/install.sh
bash "${installer}" -v "${CINC_VERSION}"

/opt/cinc/bin/cinc-client --version | grep --quiet --fixed-strings "${CINC_VERSION}"
