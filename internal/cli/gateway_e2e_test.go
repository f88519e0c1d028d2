package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/gatewaytest"
)

// realGatewayTester starts the real openshell-gateway and registers it in a
// fresh client registry as "real" (mTLS with the gateway's client
// certificate), through 'gateway add'.
func realGatewayTester(t *testing.T) (*tester, *gatewaytest.Gateway) {
	t.Helper()
	g := gatewaytest.Start(t, gatewaytest.Options{})
	tt := newTester(t)
	r := tt.run("gateway", "add", "real", "--endpoint", "https://localhost:"+strings.TrimPrefix(g.Addr, "127.0.0.1:"),
		"--ca", filepath.Join(g.TLSDir, "ca.crt"),
		"--cert", filepath.Join(g.TLSDir, "client", "tls.crt"), "--key", filepath.Join(g.TLSDir, "client", "tls.key"))
	if r.err != nil {
		t.Fatalf("gateway add: %v", r.err)
	}
	return tt, g
}

func mustRun(t *testing.T, tt *tester, args ...string) string {
	t.Helper()
	r := tt.run(args...)
	if r.err != nil {
		t.Fatalf("openshell %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

// TestWorkspaceCommandsRealGateway drives the workspace command group
// against the real gateway.
func TestWorkspaceCommandsRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)

	if out := mustRun(t, tt, "workspace", "create", "team-a", "--label", "env=dev"); out != "Created workspace team-a\n" {
		t.Errorf("create = %q", out)
	}
	if out := mustRun(t, tt, "workspace", "create", "--name", "team-b"); out != "Created workspace team-b\n" {
		t.Errorf("create --name = %q", out)
	}
	r := tt.run("workspace", "create", "team-a")
	if r.err == nil || r.err.Error() != `workspace "team-a" already exists` {
		t.Errorf("create twice: %v", r.err)
	}

	out := mustRun(t, tt, "workspace", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("list = %q, want a header and default, team-a, team-b", out)
	}
	for i, want := range []string{"default", "team-a", "team-b"} {
		if f := strings.Fields(lines[i+1]); len(f) < 3 || f[0] != want || f[1] != "Active" {
			t.Errorf("list row %d = %q, want %s Active", i+1, lines[i+1], want)
		}
	}
	if !strings.Contains(lines[2], "env=dev") {
		t.Errorf("team-a row lacks its label: %q", lines[2])
	}
	if out := mustRun(t, tt, "workspace", "list", "--label-selector", "env=dev", "-o", "json"); !strings.Contains(out, `"name": "team-a"`) || strings.Contains(out, `"team-b"`) {
		t.Errorf("list --label-selector env=dev -o json = %s", out)
	}
	if out := mustRun(t, tt, "workspace", "get", "team-a"); !strings.Contains(out, "Name:") || !strings.Contains(out, "team-a") || !strings.Contains(out, "Status:             Active") {
		t.Errorf("get = %q", out)
	}
	if r := tt.run("workspace", "get", "nope"); r.err == nil || r.err.Error() != `workspace "nope" not found` {
		t.Errorf("get nope: %v", r.err)
	}

	// Members.
	if r := tt.run("workspace", "member", "list"); r.code() != 2 || !strings.Contains(r.err.Error(), "--workspace is required") {
		t.Errorf("member list without --workspace: %v (code %d)", r.err, r.code())
	}
	if r := tt.run("--workspace", "team-a", "workspace", "member", "add", "--subject", "bob", "--role", "owner"); r.code() != 2 {
		t.Errorf("bad role: %v (code %d)", r.err, r.code())
	}
	if out := mustRun(t, tt, "--workspace", "team-a", "workspace", "member", "add", "--subject", "bob", "--role", "admin"); out != "Added bob to workspace team-a as admin\n" {
		t.Errorf("member add = %q", out)
	}
	mustRun(t, tt, "--workspace", "team-a", "workspace", "members", "add", "--subject", "carol", "--role", "user")
	out = mustRun(t, tt, "--workspace", "team-a", "workspace", "member", "list")
	for _, want := range []string{"bob", "admin", "carol", "user"} {
		if !strings.Contains(out, want) {
			t.Errorf("member list = %q lacks %q", out, want)
		}
	}
	if out := mustRun(t, tt, "--workspace", "team-a", "workspace", "member", "remove", "--subject", "bob"); out != "Removed bob from workspace team-a\n" {
		t.Errorf("member remove = %q", out)
	}
	if r := tt.run("--workspace", "team-a", "workspace", "member", "remove", "--subject", "bob"); r.err == nil || r.err.Error() != `"bob" is not a member of workspace "team-a"` {
		t.Errorf("member remove twice: %v", r.err)
	}
	if out := mustRun(t, tt, "--workspace", "team-a", "workspace", "member", "list"); strings.Contains(out, "bob") {
		t.Errorf("bob still listed: %q", out)
	}

	// Sandbox commands honour --workspace.
	if r := tt.run("--workspace", "team-b", "sandbox", "list"); r.err != nil || !strings.Contains(r.stderr, `No sandboxes in workspace "team-b"`) {
		t.Errorf("sandbox list in team-b: %q %v", r.stderr, r.err)
	}

	// A default workspace stored with the registered gateway.
	meta := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", "real", "metadata.json")
	before, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	if r := tt.run("workspace", "use", "nope"); r.err == nil || r.err.Error() != `workspace "nope" not found` {
		t.Errorf("use nope: %v", r.err)
	}
	if after, _ := os.ReadFile(meta); string(after) != string(before) {
		t.Errorf("a refused 'workspace use' changed metadata.json:\n%s", after)
	}
	if r := tt.run("workspace", "use"); r.code() != 2 {
		t.Errorf("use without NAME or --clear: %v (code %d)", r.err, r.code())
	}
	if out := mustRun(t, tt, "workspace", "use", "team-b"); out != "Default workspace of gateway \"real\": team-b\n" {
		t.Errorf("use team-b = %q", out)
	}
	var stored map[string]any
	if b, err := os.ReadFile(meta); err != nil || json.Unmarshal(b, &stored) != nil {
		t.Fatalf("read metadata.json: %v", err)
	}
	if stored["workspace"] != "team-b" || stored["gateway_endpoint"] == nil {
		t.Errorf("metadata.json = %v, want workspace team-b next to OpenShell's keys", stored)
	}
	if out := mustRun(t, tt, "gateway", "info", "real"); !strings.Contains(strings.Join(strings.Fields(out), " "), "Default workspace: team-b") {
		t.Errorf("gateway info = %q", out)
	}
	if r := tt.run("sandbox", "list"); r.err != nil || !strings.Contains(r.stderr, `No sandboxes in workspace "team-b"`) {
		t.Errorf("sandbox list with default team-b: %q %v", r.stderr, r.err)
	}
	if r := tt.run("--workspace", "default", "sandbox", "list"); r.err != nil || !strings.Contains(r.stderr, `No sandboxes in workspace "default"`) {
		t.Errorf("--workspace overrides the stored default: %q %v", r.stderr, r.err)
	}
	tt.env["OPENSHELL_WORKSPACE"] = "default"
	if r := tt.run("sandbox", "list"); r.err != nil || !strings.Contains(r.stderr, `No sandboxes in workspace "default"`) {
		t.Errorf("OPENSHELL_WORKSPACE overrides the stored default: %q %v", r.stderr, r.err)
	}
	delete(tt.env, "OPENSHELL_WORKSPACE")
	mustRun(t, tt, "workspace", "use", "--clear")
	if r := tt.run("sandbox", "list"); r.err != nil || !strings.Contains(r.stderr, `No sandboxes in workspace "default"`) {
		t.Errorf("sandbox list after --clear: %q %v", r.stderr, r.err)
	}

	if out := mustRun(t, tt, "workspace", "delete", "team-a", "team-b"); out != "Deleted workspace team-a\nDeleted workspace team-b\n" {
		t.Errorf("delete = %q", out)
	}
	if r := tt.run("workspace", "delete", "team-a"); r.err == nil || r.err.Error() != `workspace "team-a" not found` {
		t.Errorf("delete again: %v", r.err)
	}
	if r := tt.run("workspace", "delete", "default"); r.err == nil || !strings.Contains(r.err.Error(), "cannot be deleted") {
		t.Errorf("delete default: %v", r.err)
	}
}

// TestStatusRealGateway: status against the real gateway, with its client
// certificate (authenticated) and with the CA only (no client identity).
func TestStatusRealGateway(t *testing.T) {
	tt, g := realGatewayTester(t)
	out := mustRun(t, tt, "status")
	for _, want := range []string{"Status:     Connected", "Auth:       authenticated"} {
		if !strings.Contains(out, want) {
			t.Errorf("status = %q lacks %q", out, want)
		}
	}
	port := strings.TrimPrefix(g.Addr, "127.0.0.1:")
	mustRun(t, tt, "gateway", "add", "anon", "--endpoint", "https://localhost:"+port, "--ca", filepath.Join(g.TLSDir, "ca.crt"))
	r := tt.run("--gateway", "anon", "status")
	want := "Gateway:    anon\nEndpoint:   https://localhost:" + port + "\nStatus:     Connected\nVersion:    -\n" +
		"Auth:       not authenticated: the TLS handshake was refused: certificate required\n" +
		"hint: the gateway requires a client certificate it trusts: register it with 'openshell gateway add NAME --endpoint URL --ca ca.crt --cert tls.crt --key tls.key'\n"
	if r.err != nil || r.stdout != want {
		t.Errorf("status without a client certificate = %q (%v), want %q", r.stdout, r.err, want)
	}

	// A client certificate from another CA: refused by the gateway.
	other := t.TempDir()
	if out, err := exec.Command(filepath.Join(g.BinDir, "openshell-gateway"), "generate-certs", "--output-dir", other).CombinedOutput(); err != nil {
		t.Fatalf("generate-certs: %v\n%s", err, out)
	}
	mustRun(t, tt, "gateway", "add", "stranger", "--endpoint", "https://localhost:"+port, "--ca", filepath.Join(g.TLSDir, "ca.crt"),
		"--cert", filepath.Join(other, "client", "tls.crt"), "--key", filepath.Join(other, "client", "tls.key"))
	r = tt.run("--gateway", "stranger", "status")
	if r.err != nil || !strings.Contains(r.stdout, "Auth:       not authenticated: the TLS handshake was refused: ") ||
		!strings.Contains(r.stdout, "hint: the client certificate "+tt.env["XDG_CONFIG_HOME"]+"/openshell/gateways/stranger/mtls/tls.crt was not accepted") {
		t.Errorf("status with a foreign client certificate = %q (%v)", r.stdout, r.err)
	}
	// Unreachable: nothing listens any more.
	g.Stop()
	if r := tt.run("status"); r.code() != 1 || !strings.Contains(r.err.Error(), "cannot reach gateway \"real\"") {
		t.Errorf("status after stop = %q, %v", r.stdout, r.err)
	}
}

// TestCompletionsRealGateway: shell completion of workspace names (asked of
// the gateway) and of registered gateway names.
func TestCompletionsRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)
	mustRun(t, tt, "workspace", "create", "team-a")
	mustRun(t, tt, "workspace", "create", "other")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "workspace", "get", "te"}, "team-a\n:4\n"},
		{[]string{"__complete", "workspace", "delete", ""}, "default\nteam-a\nother\n:4\n"},
		{[]string{"__complete", "--workspace", "t"}, "team-a\n:4\n"},
		{[]string{"__complete", "gateway", "select", ""}, "real\n:4\n"},
		{[]string{"__complete", "--gateway", "r"}, "real\n:4\n"},
		{[]string{"__complete", "workspace", "member", "add", "--role", ""}, "user\nadmin\n:4\n"},
	} {
		r := tt.run(tc.args...)
		got, _, _ := strings.Cut(r.stdout, "Completion ended")
		if r.err != nil || got != tc.want {
			t.Errorf("%v = %q (%v), want %q", tc.args, r.stdout, r.err, tc.want)
		}
	}
}
