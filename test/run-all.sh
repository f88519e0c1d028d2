#!/usr/bin/env bash
# Runs every test in the repository. Starts the real components the
# integration suites need (PostgreSQL, ...) and stops them afterwards. Under
# CI=true a component that cannot start fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

cleanup=()
on_exit() { for ((i=${#cleanup[@]}-1; i>=0; i--)); do eval "${cleanup[i]}" || true; done; }
trap on_exit EXIT

# Packages first (root + apt-get), so `make test` alone sets up a fresh machine.
if ! "$root/test/install-deps.sh"; then
  [ "${CI:-}" = "true" ] && { echo "test: required packages are missing (CI=true)" >&2; exit 1; }
fi

need() { # need NAME CMD... : start a component; fail under CI, warn otherwise
  local name="$1"; shift
  if ! "$@"; then
    if [ "${CI:-}" = "true" ]; then echo "test: $name could not start (CI=true)" >&2; exit 1; fi
    echo "test: $name could not start; its suites will skip" >&2
    return 1
  fi
}

start_postgres() {
  local out
  out="$("$root/test/postgres/start.sh")" || return 1
  eval "$out"
  cleanup+=("'$root/test/postgres/stop.sh' '$OPENSHELL_TEST_POSTGRES_DIR'")
}
need postgres start_postgres || true

# Docker Engine with its own data root and socket (docker driver suites).
start_docker() {
  local out
  out="$("$root/test/docker/start.sh")" || return 1
  eval "$out"
  cleanup+=("'$root/test/docker/stop.sh' '$OPENSHELL_TEST_DOCKER_DIR'")
}
need docker start_docker || true

# kube-apiserver, etcd, agent-sandbox controller: built on first use, cached.
k8s_bins() { local out; out="$("$root/test/k8s/build.sh")" || return 1; eval "$out"; }
need kubernetes k8s_bins || true
# kubelet, kube-scheduler, kube-controller-manager, containerd and helm (one-node suites
# in internal/k8snode): built on first use, cached.
k8s_node_bins() { local out; out="$("$root/test/k8s/node/build.sh")" || return 1; eval "$out"; }
need kubernetes-node k8s_node_bins || true

# Binaries for end-to-end suites.
export OPENSHELL_TEST_BIN_DIR="$root/bin"

race=()
[ "${CI:-}" = "true" ] && race=(-race)
go test "${race[@]}" -count=1 -timeout 45m ./... "$@"
(cd deploy/helm/charttest && go test "${race[@]}" -count=1 ./...) # Helm chart render and lint tests (own module)
