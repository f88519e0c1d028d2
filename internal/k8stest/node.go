package k8stest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// APIServiceIP is the kubernetes Service's address (the first of the
	// cluster's Service range). The harness adds it to the bridge and relays
	// port 443 there to the apiserver, so in-cluster clients in pods
	// (KUBERNETES_SERVICE_HOST) reach it without a kube-proxy. Other
	// Services have no proxy.
	APIServiceIP string

	bin        string
	apiRelay   *Relay
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

// HostPathVolume creates a PersistentVolume of the given size (a quantity,
// "1Gi") backed by a directory under the node's state and returns the
// directory. The cluster has no dynamic provisioner: a claim without a
// storage class binds to such a volume (kube-controller-manager's
// persistentvolume-binder). The volume is retained when its claim goes and
// its directory goes with the cluster.
func (c *Cluster) HostPathVolume(t testing.TB, name, size string) string {
	t.Helper()
	if c.Node == nil {
		t.Fatal("k8stest: HostPathVolume needs a cluster started with Options.Node")
	}
	q, err := resource.ParseQuantity(size)
	if err != nil {
		t.Fatalf("k8stest: volume size %q: %v", size, err)
	}
	dir := filepath.Join(c.Node.Dir, "volumes", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	typ := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: q},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &typ}},
		},
	}
	if _, err := c.Clientset.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("k8stest: create persistentvolume %s: %v", name, err)
	}
	return dir
}

// nodeSubnets returns the pods' /24 and the Services' /24 of a node id.
func nodeSubnets(id [4]byte) (pods, services string) {
	a, b := 100+int(id[0])%100, int(id[1])
	return fmt.Sprintf("10.%d.%d.0/24", a, b), fmt.Sprintf("10.%d.%d.0/24", a, b^0x80)
}

func nodeServiceRange(id [4]byte) string {
	_, s := nodeSubnets(id)
	return s
}
