#!/usr/bin/env bash
set -o errexit -o nounset -o pipefail
# Converges the variant's Chef role in local mode, with the attributes in chef/nodes/<role>.json.

case "${DLINFRA_VARIANT:?set by node.pkr.hcl}" in
  cpu | gpu) ;;
  *) echo "20-run-chef: nothing to do for variant ${DLINFRA_VARIANT}"; exit 0 ;;
esac

: "${CHEF_ROLE:?set by node.pkr.hcl}" "${DLINFRA_CHEF_DIR:?set by node.pkr.hcl}"

attributes="${DLINFRA_CHEF_DIR}/nodes/${CHEF_ROLE}.json"
if [[ ! -f "${attributes}" ]]; then
  echo "20-run-chef: ${attributes} is missing; chef/nodes/ needs one file per image role" >&2
  exit 1
fi

# Node objects go outside the uploaded repository: chef/nodes/ holds attribute files, not node objects.
state=/var/lib/dlinfra-chef
mkdir -p "${state}"
cat >"${state}/client.rb" <<CONFIG
local_mode true
chef_repo_path '${DLINFRA_CHEF_DIR}'
cookbook_path ['${DLINFRA_CHEF_DIR}/cookbooks']
role_path '${DLINFRA_CHEF_DIR}/roles'
node_path '${state}/nodes'
file_cache_path '${state}/cache'
CONFIG

/opt/cinc/bin/cinc-client --config "${state}/client.rb" --json-attributes "${attributes}" \
  --node-name "packer-${DLINFRA_VARIANT}"
