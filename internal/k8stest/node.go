package k8stest

import (
	"fmt"
	"os"
	"path/filepath"
)

// EnvNodeBinDir names the environment variable holding the directory built
// by test/k8s/node/build.sh (kubelet, kube-scheduler,
// kube-controller-manager, containerd, containerd-shim-runc-v2, ctr).
const EnvNodeBinDir = "OPENSHELL_K8S_NODE_BIN_DIR"

// NodeName is the name the node registers under.
const NodeName = "k8stest-node"

// Images every node has, built on the machine from the host's
// busybox-static and imported into containerd (pods use them with
// imagePullPolicy Never or IfNotPresent; nothing is ever pulled).
const (
	// PauseImage is the pod sandbox image (busybox sleeping forever).
	PauseImage = "docker.io/openshell-test/pause:local"
	// BusyboxImage holds /bin/busybox and a /bin symlink per common applet;
	// its default command is /bin/sh.
	BusyboxImage = "docker.io/openshell-test/busybox:local"
)

// Node is the one node of a cluster started with [Options].Node: containerd,
// a kubelet, kube-scheduler and kube-controller-manager, with pods on a
// bridge network that exists only on this machine.
type Node struct {
	// Name is the Node object's name ([NodeName]).
	Name string
	// Dir holds the node's state (containerd, kubelet, CNI, images).
	Dir string
	// ContainerdSocket is containerd's API socket (namespace k8s.io).
	ContainerdSocket string
	// Subnet is the pods' network (a /24 on a bridge of this machine).
	Subnet string
	// IP is the bridge's address (the first of Subnet), the node IP: pods
	// reach this machine there, so a server the pods must reach (a gateway
	// started by a test) listens on it.
	IP string

	bin        string
	cgroupRoot string
	bridge     string
	bridgeMade bool
}

// NodeBinDir returns the directory holding the node binaries (see
// test/k8s/node/build.sh), or an error naming what is missing.
func NodeBinDir() (string, error) {
	dir := os.Getenv(EnvNodeBinDir)
	if dir == "" {
		return "", fmt.Errorf("%s is not set; run: eval \"$(test/k8s/node/build.sh)\"", EnvNodeBinDir)
	}
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%s=%s: %w; run test/k8s/node/build.sh", EnvNodeBinDir, dir, err)
		}
	}
	return dir, nil
}
