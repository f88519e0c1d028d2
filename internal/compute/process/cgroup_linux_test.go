package process

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/openshell-go/openshell/internal/mountinfo"
	"github.com/openshell-go/openshell/internal/nstest"
)

// TestFindCgroupRootEscaped: the host's cgroup2 mount is found at its
// real path when that path holds characters mountinfo escapes (a space
// and a tab), in a mount namespace of its own where the only cgroup2
// file system is mounted there.
func TestFindCgroupRootEscaped(t *testing.T) {
	nstest.Run(t, syscall.CLONE_NEWNS, func(t *testing.T, dir string) {
		mounts, err := mountinfo.Read("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mounts {
			if m.FSType == "cgroup2" {
				if err := syscall.Unmount(m.MountPoint, syscall.MNT_DETACH); err != nil {
					t.Fatalf("unmount %s: %v", m.MountPoint, err)
				}
			}
		}
		want := filepath.Join(dir, "cg root\tv2")
		if err := syscall.Mkdir(want, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("cgroup2", want, "cgroup2", 0, ""); err != nil {
			t.Fatalf("mount cgroup2 at %q: %v", want, err)
		}
		if got, err := (config{}).findCgroupRoot(); err != nil || got != want {
			t.Errorf("findCgroupRoot() = %q, %v; want %q", got, err, want)
		}
	})
}
