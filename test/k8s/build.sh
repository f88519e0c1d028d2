#!/usr/bin/env bash
# Builds the binaries the Kubernetes test suites run against — kube-apiserver,
# etcd and the agent-sandbox controller — from the pinned tools module in
# test/k8s/tools, and copies the agent-sandbox CRDs next to them.
#
# Output directory: $OPENSHELL_K8S_BIN_DIR when set, else
# $HOME/.cache/openshell-go/k8s/<versions-hash>/bin, where the hash covers the
# tools module's go.mod/go.sum, the Go version and the build flags, so a
# version bump builds into a fresh directory. Binaries already present are not
# rebuilt. Progress goes to stderr; stdout is a single line to eval:
#
#   eval "$(test/k8s/build.sh)"   # sets OPENSHELL_K8S_BIN_DIR
#
# A cold build takes minutes and ~3 GB of RAM (kube-apiserver). Set
# OPENSHELL_K8S_BUILD_P to change go build -p (default 2; 1 lowers peak RAM).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="$here/tools"

k8s_version=v1.37.2
sandbox_version=v0.5.6
ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"

cd "$tools"
# CGO_ENABLED=0 as in node/build.sh: tools/ and node/tools/ resolve the same
# versions, so with the same settings kubelet, kube-scheduler and
# kube-controller-manager reuse the packages kube-apiserver compiled into
# the build cache instead of compiling them again (cgo changes the build of
# package net and with it of every package above it).
export GOFLAGS=-mod=mod CGO_ENABLED=0
gover="$(go env GOVERSION)"
hash="$( { cat go.mod go.sum; echo "$gover $ldflags CGO_ENABLED=0"; } | sha256sum | cut -c1-16)"
bin="${OPENSHELL_K8S_BIN_DIR:-${HOME}/.cache/openshell-go/k8s/$hash/bin}"
mkdir -p "$bin"
bin="$(cd "$bin" && pwd)"

# One builder at a time per directory (parallel `make test` runs share it).
exec 9>"$bin/.lock"
flock 9

p="${OPENSHELL_K8S_BUILD_P:-2}"

build() { # build NAME PKG [LDFLAGS]
	local name="$1" pkg="$2" ld="${3:-}"
	if [ -x "$bin/$name" ]; then
		echo "k8s: $name: cached in $bin" >&2
		return 0
	fi
	echo "k8s: building $name ($pkg) ..." >&2
	local start=$SECONDS
	go build -p "$p" -trimpath -ldflags "$ld" -o "$bin/.$name.tmp" "$pkg" >&2
	mv -f "$bin/.$name.tmp" "$bin/$name"
	echo "k8s: built $name in $((SECONDS - start))s" >&2
}

build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
build etcd go.etcd.io/etcd/server/v3
build agent-sandbox-controller sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller

crds="$(go env GOMODCACHE)/sigs.k8s.io/agent-sandbox@$sandbox_version/k8s/crds"
[ -d "$crds" ] || go mod download sigs.k8s.io/agent-sandbox >&2
mkdir -p "$bin/crds"
cp -f "$crds"/*.yaml "$bin/crds/"
chmod u+w "$bin/crds"/*.yaml

echo "export OPENSHELL_K8S_BIN_DIR='$bin'"
