package cli

import (
	"strings"
	"testing"
)

// TestConfirmGlobal: a global change asks on a terminal and sends nothing
// unless the answer is yes (the unreachable endpoint would fail any RPC);
// without a terminal it needs --yes.
func TestConfirmGlobal(t *testing.T) {
	dir := t.TempDir()
	file := policyFile(t, dir, "p.yaml", policyV1)
	for _, tc := range []struct {
		name     string
		terminal bool
		answer   string
		args     []string
		want     string
		stderr   string
	}{
		{"terminal, no", true, "n\n", []string{"policy", "delete", "--global"}, "aborted by user",
			"Deleting global setting 'policy' re-enables sandbox-level management for this key. Continue? [y/N] "},
		{"terminal, empty answer", true, "\n", []string{"policy", "set", "--global", "--policy", file}, "aborted by user",
			"Setting 'policy' globally will disable sandbox-level management for this key. Continue? [y/N] "},
		{"terminal, yes", true, "yes\n", []string{"settings", "set", "--global", "--key", "ocsf_json_enabled", "--value", "true"}, "cannot reach", ""},
		{"no terminal", false, "y\n", []string{"settings", "delete", "--global", "--key", "ocsf_json_enabled"},
			"global setting deletes require confirmation; pass --yes in non-interactive mode", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTester(t)
			tt.stdin = strings.NewReader(tc.answer)
			tt.setup = func(a *app) { a.stdinTerminal = func() bool { return tc.terminal } }
			r := tt.run(append([]string{"--gateway-endpoint", "http://127.0.0.1:1"}, tc.args...)...)
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("openshell %v = %v, want %q", tc.args, r.err, tc.want)
			}
			if tc.stderr != "" && r.stderr != tc.stderr {
				t.Errorf("stderr = %q, want %q", r.stderr, tc.stderr)
			}
		})
	}
}
