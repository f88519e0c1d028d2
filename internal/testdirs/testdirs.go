// Package testdirs makes per-process scratch directories for tests and
// removes those of test processes that have exited. A killed or timed-out
// test never runs its cleanups, and the harnesses build binaries of
// hundreds of megabytes per test process, so without a sweep they pile up.
package testdirs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var swept sync.Map // base+prefix -> struct{}

// MkdirTemp makes a directory under base named prefix, this process's pid,
// a dash and a random suffix. The first call for a base and prefix removes
// that prefix's directories whose process has exited.
func MkdirTemp(base, prefix string) (string, error) {
	if _, done := swept.LoadOrStore(base+"\x00"+prefix, struct{}{}); !done {
		Sweep(base, []string{prefix}, time.Now())
	}
	return os.MkdirTemp(base, fmt.Sprintf("%s%d-", prefix, os.Getpid()))
}

// Sweep removes the directories under base named by one of prefixes
// followed by a pid whose process is gone. Names without a pid (written by
// older harness versions) are removed once they are an hour old.
func Sweep(base string, prefixes []string, now time.Time) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		for _, prefix := range prefixes {
			rest, ok := strings.CutPrefix(e.Name(), prefix)
			if !ok || !e.IsDir() {
				continue
			}
			pidText, _, hasPID := strings.Cut(rest, "-")
			if pid, err := strconv.Atoi(pidText); hasPID && err == nil && pid > 0 {
				if processAlive(pid) {
					break
				}
			} else if info, err := e.Info(); err != nil || now.Sub(info.ModTime()) < time.Hour {
				break
			}
			_ = os.RemoveAll(filepath.Join(base, e.Name()))
			break
		}
	}
}

// processAlive reports whether pid names a process (EPERM: it exists but
// belongs to someone else).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
