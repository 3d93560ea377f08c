#!/usr/bin/env bash
# First apply of a new region, before its in-VPC runner exists: run by an infra admin from a laptop connected to
# the region's Client VPN (the EKS endpoint is private; its security group admits the laptop pool).
#
#   scripts/bootstrap-region.sh [--dry-run] <env>-<region>      (DLINFRA_FLEET: another fleet file; --help: this)
#
# 1. applies the regional stack (AWS resources, including the CodeBuild-hosted runner) if it is not up yet;
# 2. checks that this laptop reaches the private EKS endpoint, and says to connect the VPN if not;
# 3. applies the in-cluster stack <env>-<region>-k8s with the policy pack;
# 4. checks that the runner's CodeBuild project exists, so apply.yml takes over from here.
# docs/bootstrap-region.md explains each step and how to verify it.
set -o errexit -o nounset -o pipefail

usage() {
  # The header above, without its leading "# ": what the script does and how to call it.
  sed -n '2,/^set -o/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
esac

dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
  dry_run=1
  shift
fi
if [ "$#" -ne 1 ]; then
  echo "usage: $0 [--dry-run] <env>-<region>   (for example prod-eu-west-1)" >&2
  exit 2
fi
stack="$1"
if ! [[ "${stack}" =~ ^[a-z0-9]+-[a-z]{2}(-[a-z]+)+-[0-9]$ ]]; then
  echo "error: ${stack}: not a regional stack name <env>-<region> (for example prod-eu-west-1)" >&2
  exit 2
fi
region="${stack#*-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"
# Pulumi runs the program from the project's venv (Pulumi.yaml `virtualenv: .venv`); .ci/setup makes it.
python="${root}/.venv/bin/python"
if [ ! -x "${python}" ]; then
  echo "error: ${root}/.venv does not exist: run .ci/setup first (Pulumi.yaml runs the program from it)" >&2
  exit 1
fi

run() {
  echo "+ $*"
  if [ "${dry_run}" -eq 0 ]; then
    "$@"
  fi
}

for tool in pulumi aws; do
  command -v "${tool}" >/dev/null || { echo "error: ${tool} is not installed" >&2; exit 1; }
done
# The stack must be one of the fleet's: dlinfra refuses unknown names with the list of valid ones.
rows="$("${python}" -m dlinfra --fleet "${DLINFRA_FLEET:-fleet.yaml}" stacks --json --only "${stack}-k8s")"
runner="$(echo "${rows}" | "${python}" -c 'import json, sys; print(json.load(sys.stdin)["k8s"][0]["runs_on"])')"
runner="${runner#codebuild-}"

# Pulumi's launcher for the crd_wait dynamic provider looks for `virtualenv: .venv` in the program's directory,
# stacks/, not the project root (pulumi/pulumi issue 7061; .ci/setup explains): the same venv there.
if [ -e stacks/.venv ] && [ ! -L stacks/.venv ]; then
  echo "error: ${root}/stacks/.venv exists and is not a link to ../.venv: remove it" >&2
  exit 1
fi
run ln -sfn ../.venv stacks/.venv

echo "== 1/4 regional stack ${stack} (AWS resources, the in-VPC runner)"
run pulumi up --stack "${stack}" --policy-pack "${root}/policy" --yes

echo "== 2/4 the private EKS endpoint must answer from here (Client VPN connected?)"
if [ "${dry_run}" -eq 0 ]; then
  endpoint="$(pulumi stack output --stack "${stack}" cluster_endpoint)"
  host="${endpoint#https://}"
  if ! timeout 5 bash -c "exec 3<>/dev/tcp/${host}/443" 2>/dev/null; then
    echo "error: ${host}:443 does not answer: connect the ${region} Client VPN (dlinfra vpn profile) and retry" >&2
    exit 1
  fi
else
  echo "+ (check) TCP ${region} EKS endpoint :443"
fi

echo "== 3/4 in-cluster stack ${stack}-k8s"
run pulumi up --stack "${stack}-k8s" --policy-pack "${root}/policy" --yes

echo "== 4/4 the runner that applies ${stack}-k8s from now on"
run aws codebuild batch-get-projects --region "${region}" --names "${runner}" --query 'projects[0].name'
echo "done: apply.yml now applies ${stack}-k8s on ${runner}"
