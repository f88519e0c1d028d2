#!/usr/bin/env bash
# Builds the binaries of the one-node cluster (test/k8s/node.sh and the node
# mode of internal/k8stest): kubelet, kube-scheduler and
# kube-controller-manager from the pinned module in node/tools (the same
# k8s.io/kubernetes version as the control plane in test/k8s/tools), and
# containerd 2.x with its runc shim and ctr from node/containerd. runc and the
# CNI plugins come from Debian (runc, containernetworking-plugins); this
# script only checks that they are there.
#
# It also builds helm from test/k8s/helm into
# $HOME/.cache/openshell-go/k8s-helm/<hash>/bin (override the directory with
# $OPENSHELL_K8S_HELM_DIR) and exports its path as OPENSHELL_K8S_HELM.
#
# Output directory: $OPENSHELL_K8S_NODE_BIN_DIR when set, else
# $HOME/.cache/openshell-go/k8s-node/<versions-hash>/bin, where the hash
# covers both modules' go.mod/go.sum, the Go version and the build flags.
# Binaries already present are not rebuilt. Progress goes to stderr; stdout
# is a single line to eval:
#
#   eval "$(test/k8s/node/build.sh)"   # sets OPENSHELL_K8S_NODE_BIN_DIR, OPENSHELL_K8S_HELM
#
# Set OPENSHELL_K8S_BUILD_P to change go build -p (default 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

k8s_version=v1.37.2
ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
ctr_version=v2.4.2
ctr_ldflags="-X github.com/containerd/containerd/v2/version.Version=$ctr_version"

export GOFLAGS=-mod=mod CGO_ENABLED=0
gover="$(go env GOVERSION)"
hash="$( { cat "$here"/tools/go.mod "$here"/tools/go.sum "$here"/containerd/go.mod "$here"/containerd/go.sum; echo "$gover $ldflags $ctr_ldflags CGO_ENABLED=0"; } | sha256sum | cut -c1-16)"
bin="${OPENSHELL_K8S_NODE_BIN_DIR:-${HOME}/.cache/openshell-go/k8s-node/$hash/bin}"
mkdir -p "$bin"
bin="$(cd "$bin" && pwd)"

exec 9>"$bin/.lock"
flock 9

p="${OPENSHELL_K8S_BUILD_P:-2}"

build() { # build DIR NAME PKG [LDFLAGS [TAGS]]
	local dir="$1" name="$2" pkg="$3" ld="${4:-}" tags="${5:-}"
	if [ -x "$bin/$name" ]; then
		echo "k8s-node: $name: cached in $bin" >&2
		return 0
	fi
	echo "k8s-node: building $name ($pkg) ..." >&2
	local start=$SECONDS
	(cd "$dir" && go build -p "$p" -trimpath -tags "$tags" -ldflags "$ld" -o "$bin/.$name.tmp" "$pkg") >&2
	mv -f "$bin/.$name.tmp" "$bin/$name"
	echo "k8s-node: built $name in $((SECONDS - start))s" >&2
}

ctags="no_btrfs no_devmapper no_zfs"
build "$here/containerd" containerd github.com/containerd/containerd/v2/cmd/containerd "$ctr_ldflags" "$ctags"
build "$here/containerd" containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$ctr_ldflags" "$ctags"
build "$here/containerd" ctr github.com/containerd/containerd/v2/cmd/ctr "$ctr_ldflags" "$ctags"
build "$here/tools" kubelet k8s.io/kubernetes/cmd/kubelet "$ldflags"
build "$here/tools" kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$ldflags"
build "$here/tools" kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags"

# helm (the chart suites install deploy/helm/openshell with it): its own
# module and cache directory, so the node binaries' hash stays as it is.
helm_hash="$( { cat "$here"/../helm/go.mod "$here"/../helm/go.sum; echo "$gover CGO_ENABLED=0"; } | sha256sum | cut -c1-16)"
helm_bin="${OPENSHELL_K8S_HELM_DIR:-${HOME}/.cache/openshell-go/k8s-helm/$helm_hash/bin}"
mkdir -p "$helm_bin"
helm_bin="$(cd "$helm_bin" && pwd)"
if [ -x "$helm_bin/helm" ]; then
	echo "k8s-node: helm: cached in $helm_bin" >&2
else
	echo "k8s-node: building helm (helm.sh/helm/v3/cmd/helm) ..." >&2
	start=$SECONDS
	(cd "$here/../helm" && go build -p "$p" -trimpath -o "$helm_bin/.helm.tmp" helm.sh/helm/v3/cmd/helm) >&2
	mv -f "$helm_bin/.helm.tmp" "$helm_bin/helm"
	echo "k8s-node: built helm in $((SECONDS - start))s" >&2
fi

for tool in runc; do
	command -v "$tool" >/dev/null || echo "k8s-node: warning: $tool not in PATH (apt-get install runc)" >&2
done
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] ||
	echo "k8s-node: warning: no CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)" >&2

echo "export OPENSHELL_K8S_NODE_BIN_DIR='$bin' OPENSHELL_K8S_HELM='$helm_bin/helm'"
