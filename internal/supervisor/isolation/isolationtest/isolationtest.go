// Package isolationtest holds helpers for tests of agent confinement.
package isolationtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/openshell-go/openshell/internal/testdirs"
)

var (
	once sync.Once
	bin  string
	err  error
)

// EscapeBinary builds the static escape helper (isolation/testdata/escape)
// once per test binary, into a directory named for this process (those of
// exited test processes are removed), and returns its path. Each of its attempts prints
// "ESCAPED ..." and exits 0 when it worked, "denied: ..." and exits 1 when
// the kernel refused it.
func EscapeBinary(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dir, derr := testdirs.MkdirTemp(os.TempDir(), "openshell-escape-")
		if derr != nil {
			err = derr
			return
		}
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(dir, "escape")
		cmd := exec.Command("go", "build", "-o", bin, "./testdata/escape")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("build escape helper: %w\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
