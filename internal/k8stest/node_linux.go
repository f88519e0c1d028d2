//go:build linux

package k8stest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openshell-go/openshell/internal/mountinfo"
)

// nodeTools are the host programs node mode needs besides the built binaries.
const (
	runcPath   = "/usr/sbin/runc"
	cniBinDir  = "/usr/lib/cni"
	nodeCgroup = "/sys/fs/cgroup"
)

// nodePreflight reports why node mode cannot run here, or nil.
func nodePreflight() (string, error) {
	dir, err := NodeBinDir()
	if err != nil {
		return "", err
	}
	if os.Geteuid() != 0 {
		return "", errors.New("node mode needs root (containerd and kubelet)")
	}
	for _, p := range []string{runcPath, filepath.Join(cniBinDir, "bridge"), filepath.Join(cniBinDir, "host-local"), filepath.Join(cniBinDir, "loopback"), "/bin/busybox"} {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("node mode: %w (apt-get install runc containernetworking-plugins busybox-static)", err)
		}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "", fmt.Errorf("node mode: %w (apt-get install iproute2)", err)
	}
	return dir, nil
}

// startNode starts containerd, imports the local images, then the
// kube-controller-manager, kube-scheduler and kubelet, and waits for the
// node to be Ready.
func (c *Cluster) startNode(ctx context.Context, nodeBin, kubeletToken string, id [4]byte, apiPort int) error {
	hexID := hex.EncodeToString(id[:])
	dir := filepath.Join(c.Dir, "node")
	pods, services := nodeSubnets(id)
	n := &Node{
		Name:         NodeName,
		Dir:          dir,
		Subnet:       pods,
		IP:           strings.TrimSuffix(pods, ".0/24") + ".1",
		APIServiceIP: strings.TrimSuffix(services, ".0/24") + ".1",
		cgroupRoot:   "/k8stest-" + hexID,
		bridge:       "osk" + hexID,
		bin:          nodeBin,
	}
	n.ContainerdSocket = filepath.Join(dir, "containerd", "c.sock")
	c.Node = n
	for _, d := range []string{"containerd", "cni", "cni-ipam", "kubelet", "pod-logs", "volume-plugins", "images"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}

	// The pod network: a bridge on this machine only, created up front so
	// the kubelet can take its address as the node IP (it refuses loopback).
	// Pods get no default route: only the bridge's subnet and, through the
	// bridge, the Service range (where the apiserver relay listens).
	if err := run(ctx, "ip", "link", "add", n.bridge, "type", "bridge"); err != nil {
		return err
	}
	n.bridgeMade = true
	if err := run(ctx, "ip", "addr", "add", n.IP+"/24", "dev", n.bridge); err != nil {
		return err
	}
	if err := run(ctx, "ip", "link", "set", n.bridge, "up"); err != nil {
		return err
	}
	// The kubernetes Service's address, on the bridge, relayed to the
	// apiserver (which listens on loopback; its serving certificate names
	// the Service address).
	if err := run(ctx, "ip", "addr", "add", n.APIServiceIP+"/32", "dev", n.bridge); err != nil {
		return err
	}
	apiAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort))
	relay, err := NewRelay(net.JoinHostPort(n.APIServiceIP, "443"), func() (string, error) { return apiAddr, nil })
	if err != nil {
		return fmt.Errorf("relay the apiserver to the kubernetes Service address: %w", err)
	}
	n.apiRelay = relay
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "k8stest",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": %q}], "dataDir": %q}
  }]
}
`, n.bridge, n.Subnet, n.IP, services, filepath.Join(dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-k8stest.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}

	// containerd with its own root, state and sockets.
	cd := filepath.Join(dir, "containerd")
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %q
[ttrpc]
  address = %q

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = %q
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %q
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = %t
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%q]
      conf_dir = %q
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`, filepath.Join(cd, "root"), filepath.Join(cd, "state"), n.ContainerdSocket, n.ContainerdSocket+".ttrpc",
		filepath.Join(cd, "opt"), PauseImage, restrictOOMScoreAdj(), runcPath, cniBinDir, filepath.Join(dir, "cni"))
	if err := os.WriteFile(filepath.Join(cd, "config.toml"), []byte(config), 0o644); err != nil {
		return err
	}
	path := "PATH=" + nodeBin + ":" + os.Getenv("PATH")
	containerd, err := startProc(c.Dir, "containerd", filepath.Join(nodeBin, "containerd"), []string{"--config", filepath.Join(cd, "config.toml")}, []string{path})
	if err != nil {
		return err
	}
	c.procs = append(c.procs, containerd)
	if err := poll(ctx, func() (bool, error) {
		if done, err := containerd.exited(); done {
			return false, fmt.Errorf("containerd exited (%v):\n%s", err, containerd.tail(30)) //nolint:errorlint // err is nil on a clean exit
		}
		return n.ctr(ctx, "version") == nil, nil
	}); err != nil {
		return fmt.Errorf("containerd not ready: %w\n%s", err, containerd.tail(30))
	}

	// Local images: nothing is pulled.
	bb, err := BusyboxFiles()
	if err != nil {
		return err
	}
	for _, img := range []Image{
		{Name: PauseImage, Files: bb, Entrypoint: []string{"/bin/sleep", "2147483647"}},
		{Name: BusyboxImage, Files: bb, Cmd: []string{"/bin/sh"}},
	} {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}

	// kube-controller-manager and kube-scheduler run as the admin user.
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	cm, err := startProc(c.Dir, "kube-controller-manager", filepath.Join(nodeBin, "kube-controller-manager"), []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--authentication-kubeconfig=" + c.Kubeconfig,
		"--authorization-kubeconfig=" + c.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--root-ca-file=" + c.CAFile,
		"--service-account-private-key-file=" + filepath.Join(c.Dir, "sa.key"),
		"--use-service-account-credentials=false",
		"--controllers=*,-nodeipam,-attachdetach",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, cm)
	sched, err := startProc(c.Dir, "kube-scheduler", filepath.Join(nodeBin, "kube-scheduler"), []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--authentication-kubeconfig=" + c.Kubeconfig,
		"--authorization-kubeconfig=" + c.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[1]),
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, sched)

	// The kubelet authenticates as system:node:NAME (group system:nodes),
	// bound to the bootstrap system:node ClusterRole.
	if _, err := c.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "k8stest:nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "system:nodes"}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind system:nodes: %w", err)
	}
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: kubelet
  user:
    token: %s
contexts:
- name: k8stest
  context:
    cluster: k8stest
    user: kubelet
current-context: k8stest
`, c.Host, c.CAFile, kubeletToken)), 0o600); err != nil {
		return err
	}
	kubeletConfig := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://%s
failSwapOn: false
resolvConf: ""
podLogsDir: %s
volumePluginDir: %s
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
staticPodPath: ""
`, n.cgroupRoot, n.IP, ports[2], ports[3], n.ContainerdSocket, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins"))
	if err := os.WriteFile(filepath.Join(dir, "kubelet.yaml"), []byte(kubeletConfig), 0o644); err != nil {
		return err
	}
	// cgroupRoot must exist in every hierarchy before the kubelet starts.
	// In the v1 cpuset hierarchy a new cgroup starts with no CPUs or memory
	// nodes: give it its parent's.
	if err := n.cgroups(func(p string) error {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if filepath.Base(filepath.Dir(p)) != "cpuset" {
			return nil
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(p), f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(p, f), b, 0o644); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(p, f), err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	kubelet, err := startProc(c.Dir, "kubelet", filepath.Join(nodeBin, "kubelet"), []string{
		"--config=" + filepath.Join(dir, "kubelet.yaml"),
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + filepath.Join(dir, "kubelet"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		"--v=2",
	}, []string{path})
	if err != nil {
		return err
	}
	c.procs = append(c.procs, kubelet)

	// Ready: the node reports Ready and the "default" ServiceAccount exists.
	if err := poll(ctx, func() (bool, error) {
		for _, p := range []*proc{containerd, cm, sched, kubelet} {
			if done, err := p.exited(); done {
				return false, fmt.Errorf("%s exited (%v):\n%s", p.name, err, p.tail(30)) //nolint:errorlint // err is nil on a clean exit
			}
		}
		node, err := c.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not registered yet
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("node %s not Ready: %w\n--- kubelet\n%s\n--- containerd\n%s", n.Name, err, kubelet.tail(40), containerd.tail(20))
	}
	return nil
}

// ImportImage writes img as an OCI archive and imports it into containerd's
// k8s.io namespace, where the kubelet finds it.
func (n *Node) ImportImage(ctx context.Context, img Image) error {
	name := strings.NewReplacer("/", "_", ":", "_").Replace(img.Name)
	archive := filepath.Join(n.Dir, "images", name+".tar")
	if err := WriteOCIArchive(archive, img); err != nil {
		return err
	}
	if err := n.ctr(ctx, "-n", "k8s.io", "images", "import", "--local", archive); err != nil {
		return fmt.Errorf("import image %s: %w", img.Name, err)
	}
	return nil
}

func (n *Node) ctr(ctx context.Context, args ...string) error {
	return run(ctx, filepath.Join(n.bin, "ctr"), append([]string{"--address", n.ContainerdSocket}, args...)...)
}

func run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cgroups calls fn with the node's cgroup root in every hierarchy mounted
// under /sys/fs/cgroup (the v1 ones and, on a hybrid host, "unified"), or in
// the unified one on a cgroup v2 host.
func (n *Node) cgroups(fn func(string) error) error {
	ents, err := os.ReadDir(nodeCgroup)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(nodeCgroup, "cgroup.controllers")); err == nil {
		return fn(filepath.Join(nodeCgroup, n.cgroupRoot))
	}
	for _, e := range ents {
		// "unified" too: on a hybrid host the kubelet also creates its
		// cgroups in the v2 hierarchy mounted there.
		if !e.IsDir() {
			continue
		}
		if err := fn(filepath.Join(nodeCgroup, e.Name(), n.cgroupRoot)); err != nil {
			return err
		}
	}
	return nil
}

// stopNode tears down what the kubelet and containerd leave behind once
// their processes are gone: the pods' processes (everything in the node's
// cgroups), the runc shims of this containerd, the mounts under the node's
// directory, the bridge and the cgroups.
func (n *Node) stop() {
	// Pods: kill every process in the node's cgroups, deepest first.
	_ = n.cgroups(func(root string) error {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
		return nil
	})
	// Shims started by this containerd.
	if procs, err := os.ReadDir("/proc"); err == nil {
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			if err != nil {
				continue
			}
			args := strings.Split(string(b), "\x00")
			if strings.Contains(args[0], "containerd-shim") && strings.Contains(string(b), n.ContainerdSocket) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// Mounts under the node directory (pod volumes, rootfs, netns, shm).
	unmountUnder(n.Dir)
	if n.apiRelay != nil {
		n.apiRelay.Close()
	}
	if n.bridgeMade {
		_ = exec.Command("ip", "link", "del", n.bridge).Run()
	}
	// Cgroups, deepest first, once their processes are gone.
	deadline := time.Now().Add(10 * time.Second)
	_ = n.cgroups(func(root string) error {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for syscall.Rmdir(dirs[i]) == syscall.EBUSY && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
		}
		return nil
	})
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) {
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, m := range mounts {
		if p := m.MountPoint; p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// capSysResource is CAP_SYS_RESOURCE's bit in the capability sets.
const capSysResource = 24

// restrictOOMScoreAdj reports whether containerd must keep the pods'
// oom_score_adj at or above its own: true when this process lacks
// CAP_SYS_RESOURCE (some VMs and containers withhold it even from root).
// Without that capability the kernel refuses to lower oom_score_adj, the
// kubelet asks for -998 for every pod sandbox, and runc's nsexec dies
// writing it ("failed to update /proc/self/oom_score_adj: Permission
// denied"), which runc reports as "can't get final child's PID from pipe:
// EOF".
func restrictOOMScoreAdj() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	eff, ok := capEff(string(b))
	return !ok || eff&(1<<capSysResource) == 0
}

// capEff parses the CapEff line of a /proc/PID/status text.
func capEff(status string) (uint64, bool) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n, err == nil
		}
	}
	return 0, false
}
