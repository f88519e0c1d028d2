// Package citest holds the one rule every test that needs an outside
// component follows: where the component (a binary, a kernel feature, a
// server, root) is missing, the test skips on a developer machine and
// fails under CI=true, where a test that cannot run is a failure.
//
// It is a test helper: import it only from _test.go files and other test
// helper packages (hack/check-imports.sh checks this).
package citest

import (
	"os"
	"testing"
)

// CI reports whether the tests run under CI=true.
func CI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips t with the message, or fails it under CI=true.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}
