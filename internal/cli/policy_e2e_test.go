package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/openshell-go/openshell/internal/policy/policyfile"
)

// Policy files in OpenShell's format. v1 holds the sections the supervisor
// applies at start; v2 adds a network rule, which a live sandbox takes.
const (
	policyV1 = `version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc]
  read_write: [/tmp]
landlock:
  compatibility: best_effort
process:
  run_as_user: sandbox
  run_as_group: sandbox
`
	policyV2 = policyV1 + `network_policies:
  pypi:
    name: pypi
    endpoints:
      - host: pypi.org
        port: 443
    binaries:
      - path: /usr/bin/curl
`
)

// policyFile writes content to dir/name and returns its path.
func policyFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	writeFile(t, p, content)
	return p
}

// field returns the value of "Key:" in a key/value table.
func field(out, key string) string {
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestPolicyCommandsRealGateway drives 'policy' against the real gateway
// and a real supervisor: a sandbox created with --policy FILE, an invalid
// file refused naming the field with nothing stored, a new revision set
// from a file and waited for until the supervisor reports it loaded, the
// revisions listed, the effective policy read back as the same file, and a
// global policy set, shown, overriding the sandbox's and removed.
func TestPolicyCommandsRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)
	dir := t.TempDir()
	v1 := policyFile(t, dir, "v1.yaml", policyV1)
	v2 := policyFile(t, dir, "v2.yaml", policyV2)

	if r := tt.run("sandbox", "create", "--name", "pol", "--detach", "--policy", v1, "--", "sleep", "infinity"); r.err != nil || !strings.Contains(r.stderr, "Sandbox pol is ready") {
		t.Fatalf("sandbox create --policy: %v\n%s", r.err, r.stderr)
	}
	revisions := func() []string {
		t.Helper()
		var revs []struct {
			Version uint32
			Status  string
		}
		if err := json.Unmarshal([]byte(mustRun(t, tt, "policy", "list", "pol", "-o", "json")), &revs); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range revs {
			out = append(out, fmt.Sprintf("%d:%s", r.Version, r.Status))
		}
		return out
	}
	if got := revisions(); len(got) != 1 || !strings.HasPrefix(got[0], "1:") {
		t.Fatalf("revisions after create = %v, want version 1 only", got)
	}

	// Invalid files: refused before anything is sent (an unknown field, named
	// with its line), or by the gateway (unsafe content, named); nothing is
	// stored either way.
	bad := policyFile(t, dir, "bad.yaml", strings.Replace(policyV2, "filesystem_policy:", "filesystem:", 1))
	if r := tt.run("policy", "set", "pol", "--policy", bad); r.code() != 1 || r.err.Error() != "invalid policy file "+bad+`: line 2: unknown field "filesystem" in the policy (top level)` {
		t.Errorf("policy set with an unknown field = %v (code %d)", r.err, r.code())
	}
	badPort := policyFile(t, dir, "port.yaml", strings.Replace(policyV2, "port: 443", "port: 99999", 1))
	if r := tt.run("policy", "set", "pol", "--policy", badPort); r.code() != 1 || !strings.Contains(r.err.Error(), "line 16: got !!int `99999`, want a port number (1-65535)") {
		t.Errorf("policy set with a bad port = %v", r.err)
	}
	unsafe := policyFile(t, dir, "unsafe.yaml", strings.Replace(policyV2, "run_as_user: sandbox", "run_as_user: root", 1))
	if r := tt.run("policy", "set", "pol", "--policy", unsafe); r.code() != 1 || !strings.Contains(r.err.Error(), "run_as_user must be 'sandbox' or a numeric UID/GID") {
		t.Errorf("policy set with run_as_user root = %v", r.err)
	}
	if got := revisions(); len(got) != 1 {
		t.Fatalf("revisions after refused files = %v, want version 1 only", got)
	}
	if r := tt.run("policy", "set", "pol"); r.code() != 2 || !strings.Contains(r.err.Error(), "--policy is required") {
		t.Errorf("policy set without --policy = %v (code %d)", r.err, r.code())
	}

	// A new revision from a file, waited for: the supervisor loads it.
	r := tt.run("policy", "set", "pol", "--policy", v2, "--wait", "--timeout", "90")
	if r.err != nil || !strings.Contains(r.stderr, "Policy version 2 submitted (hash: ") || !strings.Contains(r.stderr, "Policy version 2 loaded (active version: 2)") {
		t.Fatalf("policy set --wait = %v\n%s", r.err, r.stderr)
	}
	// The same file again stores nothing.
	if r := tt.run("policy", "set", "pol", "--policy", v2); r.err != nil || !strings.Contains(r.stderr, "Policy unchanged (version 2, hash: ") {
		t.Errorf("policy set of the policy in force = %v %q", r.err, r.stderr)
	}
	if got := revisions(); len(got) != 2 || got[0] != "2:loaded" {
		t.Errorf("revisions = %v, want version 2 loaded first", got)
	}
	out := squash(mustRun(t, tt, "policy", "list", "pol"))
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || lines[0] != "VERSION HASH STATUS CREATED ERROR" || !strings.HasPrefix(lines[1], "2 ") || !strings.Contains(lines[1], " Loaded ") {
		t.Errorf("policy list = %q", out)
	}
	out = mustRun(t, tt, "policy", "get", "pol", "--rev", "2")
	if field(out, "Version") != "2" || field(out, "Status") != "Loaded" || field(out, "Active") != "2" || field(out, "Loaded") == "" {
		t.Errorf("policy get --rev 2 = %q", out)
	}
	out = mustRun(t, tt, "policy", "get", "pol", "--full")
	if field(out, "Version") != "2" || field(out, "Status") != "Effective" || field(out, "Source") != "sandbox" {
		t.Errorf("policy get = %q", out)
	}
	// The policy read back is the file that was set.
	_, doc, ok := strings.Cut(out, "---\n")
	if !ok {
		t.Fatalf("policy get --full has no policy: %q", out)
	}
	got, err := policyfile.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("policy get --full printed an unreadable policy: %v\n%s", err, doc)
	}
	want, _ := policyfile.Parse([]byte(policyV2))
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("policy read back differs from the file (-file +gateway):\n%s", diff)
	}
	var view struct {
		Version      uint32
		Status       string
		PolicySource string `json:"policy_source"`
		Policy       struct {
			NetworkPolicies map[string]any `json:"network_policies"`
		}
	}
	if err := json.Unmarshal([]byte(mustRun(t, tt, "policy", "get", "pol", "--full", "-o", "json")), &view); err != nil ||
		view.Version != 2 || view.Status != "effective" || view.PolicySource != "sandbox" || view.Policy.NetworkPolicies["pypi"] == nil {
		t.Errorf("policy get -o json = %+v, %v", view, err)
	}
	if out := mustRun(t, tt, "policy", "get", "pol", "-o", "yaml"); !strings.Contains(out, "version: 2\n") || strings.Contains(out, "policy:") {
		t.Errorf("policy get -o yaml (no --full) = %q", out)
	}
	// A missing revision is named as such, not as a missing sandbox.
	if r := tt.run("policy", "get", "pol", "--rev", "9"); r.code() != 1 || r.err.Error() != `policy revision 9 not found in sandbox "pol"` {
		t.Errorf("policy get --rev 9 = %v", r.err)
	}
	if r := tt.run("policy", "get", "nope", "--rev", "1"); r.code() != 1 || r.err.Error() != `sandbox "nope" not found in workspace "default"` {
		t.Errorf("policy get nope --rev 1 = %v", r.err)
	}
	if r := tt.run("policy", "get", "nope"); r.code() != 1 || r.err.Error() != `sandbox "nope" not found in workspace "default"` {
		t.Errorf("policy get nope = %v", r.err)
	}
	if r := tt.run("policy", "get"); r.code() != 2 {
		t.Errorf("policy get without a name: code %d", r.code())
	}

	// Global policy: none yet (as OpenShell: a note, exit 0); confirmation
	// required without a terminal; set, shown, in force over the sandbox's
	// own, removed.
	if r := tt.run("policy", "get", "--global"); r.err != nil || r.stdout != "" || r.stderr != "No global policy history found\n" {
		t.Errorf("policy get --global with none set = %v %q %q", r.err, r.stdout, r.stderr)
	}
	if r := tt.run("policy", "get", "--global", "--rev", "3"); r.code() != 1 || r.err.Error() != "global policy revision 3 not found" {
		t.Errorf("policy get --global --rev 3 = %v", r.err)
	}
	if r := tt.run("policy", "set", "--global", "--policy", v2); r.code() != 2 || !strings.Contains(r.err.Error(), "pass --yes in non-interactive mode") {
		t.Errorf("policy set --global without --yes = %v (code %d)", r.err, r.code())
	}
	if r := tt.run("policy", "set", "pol", "--global", "--policy", v2, "--yes"); r.code() != 2 || !strings.Contains(r.err.Error(), "does not accept a sandbox name") {
		t.Errorf("policy set NAME --global = %v", r.err)
	}
	if r := tt.run("policy", "set", "--global", "--policy", v2, "--yes"); r.err != nil || !strings.Contains(r.stderr, "Global policy version 1 configured") {
		t.Fatalf("policy set --global = %v %q", r.err, r.stderr)
	}
	out = mustRun(t, tt, "policy", "get", "pol")
	if field(out, "Source") != "global" || field(out, "Global") != "1" || field(out, "Version") != "1" {
		t.Errorf("policy get under a global policy = %q", out)
	}
	out = mustRun(t, tt, "policy", "get", "--global")
	if field(out, "Scope") != "global" || field(out, "Version") != "1" || field(out, "Status") != "Loaded" {
		t.Errorf("policy get --global = %q", out)
	}
	if out := squash(mustRun(t, tt, "policy", "list", "--global")); !strings.Contains(out, "\n1 ") {
		t.Errorf("policy list --global = %q", out)
	}
	if r := tt.run("policy", "set", "pol", "--policy", v2); r.code() != 1 || !strings.Contains(r.err.Error(), "policy is managed globally") {
		t.Errorf("policy set under a global policy = %v", r.err)
	}
	if r := tt.run("policy", "delete"); r.code() != 2 || !strings.Contains(r.err.Error(), "use --global") {
		t.Errorf("policy delete without --global = %v", r.err)
	}
	if out := mustRun(t, tt, "policy", "delete", "--global", "--yes"); !strings.HasPrefix(out, "Deleted global setting policy (revision ") {
		t.Errorf("policy delete --global = %q", out)
	}
	if out := mustRun(t, tt, "policy", "delete", "--global", "--yes"); out != "Global setting policy not found\n" {
		t.Errorf("policy delete --global again = %q", out)
	}
	if out := mustRun(t, tt, "policy", "get", "pol"); field(out, "Source") != "sandbox" || field(out, "Version") != "2" {
		t.Errorf("policy get after removing the global policy = %q", out)
	}

	// Completion: sandbox names for NAME, YAML files for --policy.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "policy", "get", "p"}, "pol\n:4\n"},
		{[]string{"__complete", "policy", "set", "pol", "--policy", ""}, "yaml\nyml\n:8\n"},
		{[]string{"__complete", "sandbox", "create", "--policy", ""}, "yaml\nyml\n:8\n"},
	} {
		r := tt.run(tc.args...)
		if got, _, _ := strings.Cut(r.stdout, "Completion ended"); r.err != nil || got != tc.want {
			t.Errorf("%v = %q (%v), want %q", tc.args, r.stdout, r.err, tc.want)
		}
	}
}

// TestSettingsCommandsRealGateway drives 'settings' against the real
// gateway at both scopes: values typed by key, the effective scope of each
// key on a sandbox, the global value winning, refusals named.
func TestSettingsCommandsRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)
	if r := tt.run("sandbox", "create", "--name", "set", "--detach", "--", "sleep", "infinity"); r.err != nil {
		t.Fatalf("sandbox create: %v\n%s", r.err, r.stderr)
	}

	out := mustRun(t, tt, "settings", "get", "--global")
	if field(out, "Scope") != "global" || field(out, "Settings Rev") != "0" || !strings.Contains(out, "  ocsf_json_enabled = <unset>\n") {
		t.Errorf("settings get --global (nothing set) = %q", out)
	}
	if r := tt.run("settings", "set", "--global", "--key", "ocsf_json_enabled", "--value", "yes"); r.code() != 2 || !strings.Contains(r.err.Error(), "pass --yes") {
		t.Errorf("settings set --global without --yes = %v", r.err)
	}
	if out := mustRun(t, tt, "settings", "set", "--global", "--key", "ocsf_json_enabled", "--value", "yes", "--yes"); out != "Set global setting ocsf_json_enabled=yes (revision 1)\n" {
		t.Errorf("settings set --global = %q", out)
	}
	if out := mustRun(t, tt, "settings", "set", "set", "--key", "proposal_approval_mode", "--value", "auto"); out != "Set sandbox setting proposal_approval_mode=auto for set (revision 1)\n" {
		t.Errorf("settings set NAME = %q", out)
	}

	out = mustRun(t, tt, "settings", "get", "set")
	for _, want := range []string{"Sandbox:       set\n", "Policy Source: sandbox\n", "  ocsf_json_enabled = true (global)\n",
		"  proposal_approval_mode = auto (sandbox)\n", "  agent_policy_proposals_enabled = <unset> (unset)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("settings get NAME = %q, want it to contain %q", out, want)
		}
	}
	var sv struct {
		Sandbox  string
		Settings map[string]struct{ Value, Scope string }
	}
	if err := json.Unmarshal([]byte(mustRun(t, tt, "settings", "get", "set", "--json")), &sv); err != nil ||
		sv.Sandbox != "set" || sv.Settings["ocsf_json_enabled"].Scope != "global" || sv.Settings["proposal_approval_mode"].Value != "auto" {
		t.Errorf("settings get --json = %+v, %v", sv, err)
	}
	if out := mustRun(t, tt, "settings", "get", "--global", "-o", "yaml"); !strings.Contains(out, "ocsf_json_enabled: \"true\"") || !strings.Contains(out, "settings_revision: 1") {
		t.Errorf("settings get --global -o yaml = %q", out)
	}

	// Refusals: client-side for an unknown key or a mistyped value, by the
	// gateway for a key set globally or a global-only key.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"settings", "set", "set", "--key", "bogus", "--value", "1"}, 2, "unknown setting key 'bogus'. Allowed keys: providers_v2_enabled, "},
		{[]string{"settings", "set", "set", "--key", "ocsf_json_enabled", "--value", "maybe"}, 2, "invalid bool value 'maybe' for key 'ocsf_json_enabled'"},
		{[]string{"settings", "set", "set", "--key", "proposal_approval_mode", "--value", "autom"}, 2, "expected one of: manual, auto"},
		{[]string{"settings", "set", "set", "--key", "ocsf_json_enabled", "--value", "false"}, 1, "setting 'ocsf_json_enabled' is managed globally"},
		{[]string{"settings", "set", "set", "--key", "providers_v2_enabled", "--value", "true"}, 1, "providers_v2_enabled"},
		{[]string{"settings", "set", "--key", "ocsf_json_enabled", "--value", "true"}, 2, "a sandbox name is required"},
		{[]string{"settings", "get", "set", "--global"}, 2, "settings get --global does not accept a sandbox name"},
		{[]string{"settings", "get", "nope"}, 1, `sandbox "nope" not found in workspace "default"`},
	} {
		r := tt.run(tc.args...)
		if r.code() != tc.code || r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("openshell %s = %v (code %d), want code %d and %q", strings.Join(tc.args, " "), r.err, r.code(), tc.code, tc.want)
		}
	}

	if out := mustRun(t, tt, "settings", "delete", "set", "--key", "proposal_approval_mode"); out != "Deleted sandbox setting proposal_approval_mode for set (revision 2)\n" {
		t.Errorf("settings delete NAME = %q", out)
	}
	if out := mustRun(t, tt, "settings", "delete", "set", "--key", "proposal_approval_mode"); out != "Sandbox setting proposal_approval_mode not found for set\n" {
		t.Errorf("settings delete NAME again = %q", out)
	}
	if out := mustRun(t, tt, "settings", "delete", "--global", "--key", "ocsf_json_enabled", "--yes"); out != "Deleted global setting ocsf_json_enabled (revision 2)\n" {
		t.Errorf("settings delete --global = %q", out)
	}
	if out := mustRun(t, tt, "settings", "get", "set"); !strings.Contains(out, "  ocsf_json_enabled = <unset> (unset)\n") || !strings.Contains(out, "  proposal_approval_mode = <unset> (unset)\n") {
		t.Errorf("settings get NAME after deletes = %q", out)
	}

	r := tt.run("__complete", "settings", "set", "--key", "")
	if got, _, _ := strings.Cut(r.stdout, "Completion ended"); got != "providers_v2_enabled\nocsf_json_enabled\nagent_policy_proposals_enabled\nproposal_approval_mode\n:4\n" {
		t.Errorf("complete --key = %q", r.stdout)
	}
}

// TestPolicyUpdateRealGateway: 'policy update' against the real gateway and
// a real supervisor. Each command is one new revision the supervisor loads;
// --dry-run prints the merged policy and stores nothing; a flag the
// gateway cannot apply stores nothing either.
func TestPolicyUpdateRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)
	v1 := policyFile(t, t.TempDir(), "v1.yaml", policyV1)
	if r := tt.run("sandbox", "create", "--name", "upd", "--detach", "--policy", v1, "--", "sleep", "infinity"); r.err != nil {
		t.Fatalf("sandbox create: %v\n%s", r.err, r.stderr)
	}
	revisionCount := func() int {
		t.Helper()
		var revs []any
		if err := json.Unmarshal([]byte(mustRun(t, tt, "policy", "list", "upd", "-o", "json")), &revs); err != nil {
			t.Fatal(err)
		}
		return len(revs)
	}
	update := func(version int, args ...string) {
		t.Helper()
		r := tt.run(append([]string{"policy", "update", "upd"}, append(args, "--wait", "--timeout", "90")...)...)
		if r.err != nil || !strings.Contains(r.stderr, fmt.Sprintf("Policy version %d submitted", version)) || !strings.Contains(r.stderr, fmt.Sprintf("Policy version %d loaded", version)) {
			t.Fatalf("policy update %v = %v\n%s", args, r.err, r.stderr)
		}
	}
	update(2, "--add-endpoint", "pypi.org:443", "--binary", "/usr/bin/pip", "--binary", "/usr/bin/curl")
	update(3, "--add-endpoint", "api.github.com:443:read-only:rest:enforce", "--binary", "/usr/bin/gh", "--rule-name", "github")
	update(4, "--add-allow", "api.github.com:443:post:/repos/*/issues", "--add-deny", "api.github.com:443:GET:/admin/**")

	out := mustRun(t, tt, "policy", "get", "upd", "--full")
	_, doc, _ := strings.Cut(out, "---\n")
	got, err := policyfile.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("policy get --full: %v\n%s", err, out)
	}
	pypi, gh := got.GetNetworkPolicies()["allow_pypi_org_443"], got.GetNetworkPolicies()["github"]
	if len(pypi.GetBinaries()) != 2 || pypi.GetEndpoints()[0].GetHost() != "pypi.org" {
		t.Errorf("allow_pypi_org_443 = %v", pypi)
	}
	ep := gh.GetEndpoints()
	if len(ep) != 1 || ep[0].GetProtocol() != "rest" || ep[0].GetEnforcement() != "enforce" || len(ep[0].GetDenyRules()) != 1 || ep[0].GetDenyRules()[0].GetPath() != "/admin/**" {
		t.Fatalf("github rule = %v", gh)
	}
	var posts []string
	for _, r := range ep[0].GetRules() {
		if r.GetAllow().GetMethod() == "POST" {
			posts = append(posts, r.GetAllow().GetPath())
		}
	}
	if len(posts) != 1 || posts[0] != "/repos/*/issues" {
		t.Errorf("github allow rules = %v, want the added POST /repos/*/issues (method upper-cased)", ep[0].GetRules())
	}

	// --dry-run: the merged policy, nothing stored.
	r := tt.run("policy", "update", "upd", "--remove-rule", "allow_pypi_org_443", "--dry-run")
	if r.err != nil || !strings.Contains(r.stderr, "Dry run preview for 1 incremental policy operation(s)") || !strings.HasPrefix(r.stdout, "---\nversion: 1\n") ||
		strings.Contains(r.stdout, "pypi.org") || !strings.Contains(r.stdout, "api.github.com") {
		t.Errorf("policy update --dry-run = %v\nstdout: %s\nstderr: %s", r.err, r.stdout, r.stderr)
	}
	if n := revisionCount(); n != 4 {
		t.Errorf("revisions after --dry-run = %d, want 4", n)
	}
	// Refused by the gateway (no such endpoint) and by the CLI: nothing stored.
	if r := tt.run("policy", "update", "upd", "--add-allow", "nowhere.example:443:GET:/x"); r.code() != 1 || !strings.Contains(r.err.Error(), "nowhere.example") {
		t.Errorf("policy update --add-allow to a missing endpoint = %v (code %d)", r.err, r.code())
	}
	if r := tt.run("policy", "update", "upd", "--add-endpoint", "pypi.org:0"); r.code() != 2 || r.err.Error() != "--add-endpoint port must be in the range 1-65535, got '0' in 'pypi.org:0'\nRun 'openshell policy update --help' for usage" {
		t.Errorf("policy update with port 0 = %v (code %d)", r.err, r.code())
	}
	if n := revisionCount(); n != 4 {
		t.Errorf("revisions after refused updates = %d, want 4", n)
	}
	update(5, "--remove-rule", "allow_pypi_org_443", "--remove-endpoint", "api.github.com:443")
	if out := mustRun(t, tt, "policy", "get", "upd", "--full"); strings.Contains(out, "network_policies") {
		t.Errorf("policy after removing every rule = %q", out)
	}
}
