package nstest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRunMountStaysInside: a tmpfs mounted and written to by the body in
// its own mount namespace is not seen by the parent (the file lands on
// the tmpfs, which the host never has), and the body gets the parent's
// scratch directory.
func TestRunMountStaysInside(t *testing.T) {
	dir := Run(t, syscall.CLONE_NEWNS|syscall.CLONE_NEWUTS, func(t *testing.T, dir string) {
		if dir == "" {
			t.Fatal("no scratch directory")
		}
		if err := syscall.Sethostname([]byte("nstest-child")); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "inside"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if dir == "" {
		return // the child
	}
	if _, err := os.Stat(filepath.Join(dir, "inside")); !os.IsNotExist(err) {
		t.Errorf("file written on the child's tmpfs seen by the parent: %v", err)
	}
	if h, _ := os.Hostname(); h == "nstest-child" {
		t.Error("the child's hostname reached the parent")
	}
}
