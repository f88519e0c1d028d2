#!/usr/bin/env bash
# Runs only the one-node Kubernetes suites (go test ./internal/k8snode/...):
# builds or reuses the control-plane binaries (test/k8s/build.sh) and the node binaries (test/k8s/node/build.sh), then
# runs the tests, which start etcd, kube-apiserver, the agent-sandbox
# controller, containerd, kube-controller-manager, kube-scheduler and a
# kubelet per cluster. Needs root. Extra arguments go to go test.
#
# `make test` runs them too; `make test-k8s-node` runs only them.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
"$root/test/install-deps.sh"
eval "$("$root/test/k8s/build.sh")"
eval "$("$root/test/k8s/node/build.sh")"
export OPENSHELL_TEST_BIN_DIR="$root/bin"
go test -count=1 -timeout 30m ./internal/k8snode/... "$@"
