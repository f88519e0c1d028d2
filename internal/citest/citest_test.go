package citest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSkipOrFail runs the helper in a child test process with and
// without CI=true and checks that it skips in one and fails in the other.
func TestSkipOrFail(t *testing.T) {
	if os.Getenv("CITEST_CHILD") == "1" {
		SkipOrFail(t, "no %s here", "widget")
		t.Error("SkipOrFail returned")
		return
	}
	for _, tc := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestSkipOrFail"},
		{"false", false, "--- SKIP: TestSkipOrFail"},
		{"true", true, "--- FAIL: TestSkipOrFail"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipOrFail$", "-test.v")
		cmd.Env = append(os.Environ(), "CITEST_CHILD=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if gotFail := err != nil; gotFail != tc.wantFail {
			t.Errorf("CI=%q: child failed = %v, want %v\n%s", tc.ci, gotFail, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "no widget here") {
			t.Errorf("CI=%q: output lacks %q and the message:\n%s", tc.ci, tc.want, out)
		}
		if strings.Contains(string(out), "SkipOrFail returned") {
			t.Errorf("CI=%q: SkipOrFail returned:\n%s", tc.ci, out)
		}
	}
}
