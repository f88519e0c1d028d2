package mountinfo

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openshell-go/openshell/internal/nstest"
)

// oddNames are mount point names with every character the kernel escapes.
var oddNames = []string{"with space", "with\ttab", "with\nnewline", `with\backslash`, "all \t\n\\ four"}

// TestReadKernel mounts tmpfs file systems at paths holding a space, a
// tab, a newline and a backslash in a mount namespace of its own and
// reads them back from the kernel's /proc/self/mountinfo.
func TestReadKernel(t *testing.T) {
	nstest.Run(t, syscall.CLONE_NEWNS, func(t *testing.T, dir string) {
		want := map[string]bool{}
		for _, n := range oddNames {
			p := filepath.Join(dir, n)
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mount("tmpfs", p, "tmpfs", syscall.MS_NOEXEC, ""); err != nil {
				t.Fatalf("mount tmpfs at %q: %v", p, err)
			}
			want[p] = true
		}
		mounts, err := Read("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mounts {
			if want[m.MountPoint] {
				delete(want, m.MountPoint)
				if !strings.Contains(","+m.Options+",", ",noexec,") || m.FSType != "tmpfs" {
					t.Errorf("mount %q: options %q, type %q; want noexec among the options, tmpfs", m.MountPoint, m.Options, m.FSType)
				}
			}
		}
		for p := range want {
			t.Errorf("mount point %q not read back from /proc/self/mountinfo", p)
		}
		if _, err := Read(filepath.Join(dir, "missing")); err == nil {
			t.Error("Read(missing file) succeeded")
		}
	})
}
