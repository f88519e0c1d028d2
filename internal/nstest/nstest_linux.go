// Package nstest runs a test's body in new Linux namespaces: the test
// binary is started again, for that test alone, with the namespaces asked
// for, so that what the body does (mounts, links) never reaches the host.
// The test needs root; without it the test skips, or fails under CI=true.
//
// It is a test helper: import it only from _test.go files and other test
// helper packages (hack/check-imports.sh checks this).
package nstest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/openshell-go/openshell/internal/citest"
)

// In the child, childEnv names the test whose body it runs and dirEnv the
// parent's scratch directory.
const (
	childEnv = "OPENSHELL_NSTEST_CHILD"
	dirEnv   = "OPENSHELL_NSTEST_DIR"
)

// Run runs body(t, dir) in a child test process with the namespaces in
// cloneflags (syscall.CLONE_NEWNS, ...), where dir is a scratch directory
// the parent removes once the child is gone. With CLONE_NEWNS every mount
// is made private first, so no mount propagates to the host. In the
// parent, Run fails t with the child's output unless the child's test
// passed (body failing fails that test), and returns dir. In the child
// it returns "" once body has returned: code after Run runs in both
// processes.
func Run(t *testing.T, cloneflags uintptr, body func(t *testing.T, dir string)) (dir string) {
	t.Helper()
	if name := os.Getenv(childEnv); name != "" {
		if name != t.Name() {
			t.Fatalf("nstest: child for %q runs %q", name, t.Name())
		}
		if cloneflags&syscall.CLONE_NEWNS != 0 {
			if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
				t.Fatalf("nstest: make mounts private: %v", err)
			}
		}
		body(t, os.Getenv(dirEnv))
		return ""
	}
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root to create namespaces")
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.v", "-test.count=1")
	dir = t.TempDir()
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), dirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err == nil && strings.Contains(string(out), "--- SKIP: "+t.Name()) {
		citest.SkipOrFail(t, "%s skipped in new namespaces:\n%s", t.Name(), out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in new namespaces: %v\n%s", t.Name(), err, out)
	}
	return dir
}
