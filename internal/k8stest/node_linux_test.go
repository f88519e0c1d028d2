//go:build linux

package k8stest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openshell-go/openshell/internal/mountinfo"
	"github.com/openshell-go/openshell/internal/nstest"
)

// TestUnmountUnder mounts tmpfs file systems below a directory, at names
// the kernel escapes in mountinfo (space, tab, newline, backslash) and
// nested, plus one beside it with the same prefix, in a mount namespace
// of its own, and checks that unmountUnder removes exactly those below
// the directory.
func TestUnmountUnder(t *testing.T) {
	nstest.Run(t, syscall.CLONE_NEWNS, func(t *testing.T, base string) {
		dir := filepath.Join(base, "node dir")
		beside := dir + "-beside"
		var below []string
		for _, p := range []string{dir, filepath.Join(dir, "a b"), filepath.Join(dir, "a b", "tab\tnl\nback\\"), filepath.Join(dir, "plain"), beside} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mount("tmpfs", p, "tmpfs", 0, ""); err != nil {
				t.Fatalf("mount tmpfs at %q: %v", p, err)
			}
			if p != beside {
				below = append(below, p)
			}
		}
		mounted := func() map[string]bool {
			mounts, err := mountinfo.Read("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			m := map[string]bool{}
			for _, e := range mounts {
				m[e.MountPoint] = true
			}
			return m
		}
		before := mounted()
		for _, p := range append(below, beside) {
			if !before[p] {
				t.Fatalf("%q not mounted before unmountUnder", p)
			}
		}
		unmountUnder(dir)
		after := mounted()
		for _, p := range below {
			if after[p] {
				t.Errorf("%q still mounted after unmountUnder(%q)", p, dir)
			}
		}
		if !after[beside] {
			t.Errorf("%q (beside, not below, %q) was unmounted", beside, dir)
		}
	})
}

func TestCapEff(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   uint64
		ok     bool
	}{
		// This VM: root without CAP_SYS_RESOURCE (bit 24).
		{"Name:\tx\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n", 0x1fffeffffff, true},
		{"CapEff:\t000001ffffffffff\n", 0x1ffffffffff, true},
		{"Name:\tx\n", 0, false},
		{"CapEff:\tzz\n", 0, false},
	} {
		got, ok := capEff(tc.status)
		if got != tc.want || ok != tc.ok {
			t.Errorf("capEff(%q) = %#x, %v; want %#x, %v", tc.status, got, ok, tc.want, tc.ok)
		}
	}
	if eff, _ := capEff("CapEff:\t000001fffeffffff\n"); eff&(1<<capSysResource) != 0 {
		t.Error("CAP_SYS_RESOURCE reported present in 0x1fffeffffff")
	}
}

// TestNodeTeardownLeavesNothing starts a node, runs a pod on it, stops the
// cluster and checks that nothing of the node is left on the machine: no
// process started for it (containerd, kubelet, shims), no mount under its
// directory, no cgroup in any hierarchy (the v1 ones and the hybrid
// "unified" one), no bridge, no kubernetes Service address.
func TestNodeTeardownLeavesNothing(t *testing.T) {
	bin, err := BinDir()
	if err != nil {
		unavailable(t, err)
	}
	if _, err := nodePreflight(); err != nil {
		unavailable(t, err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c, err := start(ctx, dir, bin, Options{Node: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.stop()
		}
	})
	n := c.Node

	const ns = "default"
	if _, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "runner",
			Containers: []corev1.Container{{
				Name: "sleeper", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sleep", "3600"},
			}},
		},
	}
	if _, err := c.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func() (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, "sleeper", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatalf("pod not Running: %v\n%s", err, c.logTails(20))
	}

	c.stop()
	stopped = true

	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			t.Errorf("process %s left: %s", p.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if mounts, err := mountinfo.Read("/proc/self/mountinfo"); err == nil {
		for _, m := range mounts {
			if strings.HasPrefix(m.MountPoint, dir) {
				t.Errorf("mount left: %s", m.MountPoint)
			}
		}
	}
	// Every hierarchy, whatever the harness walks.
	left, _ := filepath.Glob("/sys/fs/cgroup/*" + n.cgroupRoot)
	if isDir("/sys/fs/cgroup" + n.cgroupRoot) {
		left = append(left, "/sys/fs/cgroup"+n.cgroupRoot)
	}
	for _, d := range left {
		t.Errorf("cgroup left: %s", d)
	}
	if err := exec.Command("ip", "link", "show", n.bridge).Run(); err == nil {
		t.Errorf("bridge %s left", n.bridge)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), n.APIServiceIP+"/") || strings.HasPrefix(a.String(), n.IP+"/") {
				t.Errorf("address %s left", a)
			}
		}
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
