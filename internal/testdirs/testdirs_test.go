package testdirs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSweep: directories of exited test processes and old pid-less
// ones are removed; those of live processes, fresh pid-less ones and
// unrelated names are kept.
func TestSweep(t *testing.T) {
	base := t.TempDir()
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := exited.Process.Pid
	now := time.Now()
	dirs := map[string]bool{ // name -> kept
		fmt.Sprintf("bin-%d-123", deadPID):      false,
		fmt.Sprintf("helper-%d-9", deadPID):     false,
		fmt.Sprintf("t-%d-77", deadPID):         false,
		fmt.Sprintf("bin-%d-456", os.Getpid()):  true,
		fmt.Sprintf("fakeic-%d-1", os.Getpid()): true,
		"bin-1013902446":                        false, // old format, two hours old
		"helper-55":                             true,  // old format, fresh
		"unrelated-1-2":                         true,
	}
	for name := range dirs {
		p := filepath.Join(base, name)
		if err := os.MkdirAll(filepath.Join(p, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if name == "bin-1013902446" {
			old := now.Add(-2 * time.Hour)
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	Sweep(base, []string{"bin-", "helper-", "t-", "fakeic-"}, now)
	for name, kept := range dirs {
		_, err := os.Stat(filepath.Join(base, name))
		if got := err == nil; got != kept {
			t.Errorf("%s: kept = %v, want %v (%v)", name, got, kept, err)
		}
	}
}

// TestMkdirTempNamesPID: the directory carries this process's pid, and a
// first call sweeps an exited process's directory of the same prefix.
func TestMkdirTempNamesPID(t *testing.T) {
	base := t.TempDir()
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(base, fmt.Sprintf("x-%d-1", exited.Process.Pid))
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	dir, err := MkdirTemp(base, "x-")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("x-%d-", os.Getpid()); !strings.HasPrefix(filepath.Base(dir), want) {
		t.Errorf("dir = %s, want prefix %s", dir, want)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale dir of an exited process kept: %v", err)
	}
}
