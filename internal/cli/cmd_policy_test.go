package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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

// TestPolicyUpdatePlan: 'policy update' flags become merge operations, or
// usage errors with OpenShell's texts before anything is sent.
func TestPolicyUpdatePlan(t *testing.T) {
	fl := updateFlags{
		addEndpoints: []string{"api.example.com:443:read-write:rest:enforce:request-body-credential-rewrite,allowed-ip=10.0.0.0/8"},
		binaries:     []string{"/usr/bin/gh", " /usr/bin/gh "},
		addAllow:     []string{"b.example:443:get:/x", "a.example:443:POST:/y", "b.example:443:PUT:/z"},
		addDeny:      []string{"a.example:443:DELETE:**"},
		removeRules:  []string{"old"},
	}
	ops, err := fl.plan()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, op := range ops {
		kinds = append(kinds, fmt.Sprintf("%T", op.GetOperation()))
	}
	wantKinds := []string{"*openshellv1.PolicyMergeOperation_AddRule", "*openshellv1.PolicyMergeOperation_RemoveRule",
		"*openshellv1.PolicyMergeOperation_AddAllowRules", "*openshellv1.PolicyMergeOperation_AddAllowRules", "*openshellv1.PolicyMergeOperation_AddDenyRules"}
	if diff := cmp.Diff(wantKinds, kinds); diff != "" {
		t.Fatalf("operations (-want +got):\n%s", diff)
	}
	add := ops[0].GetAddRule()
	ep := add.GetRule().GetEndpoints()[0]
	if add.GetRuleName() != "allow_api_example_com_443" || len(add.GetRule().GetBinaries()) != 1 || ep.GetAccess() != "read-write" ||
		ep.GetProtocol() != "rest" || !ep.GetRequestBodyCredentialRewrite() || ep.GetAllowedIps()[0] != "10.0.0.0/8" || ep.GetPorts()[0] != 443 {
		t.Errorf("add_rule = %v", add)
	}
	if a := ops[2].GetAddAllowRules(); a.GetHost() != "a.example" || a.GetRules()[0].GetAllow().GetMethod() != "POST" {
		t.Errorf("first add_allow_rules = %v, want a.example first", a)
	}
	if b := ops[3].GetAddAllowRules(); b.GetHost() != "b.example" || len(b.GetRules()) != 2 || b.GetRules()[0].GetAllow().GetMethod() != "GET" {
		t.Errorf("second add_allow_rules = %v, want b.example's two rules, upper-cased", b)
	}

	for _, tc := range []struct {
		fl   updateFlags
		want string
	}{
		{updateFlags{}, "policy update requires at least one operation flag"},
		{updateFlags{binaries: []string{"/bin/x"}, removeRules: []string{"r"}}, "--binary can only be used with --add-endpoint"},
		{updateFlags{addEndpoints: []string{"a:1", "b:2"}, ruleNameSet: true}, "--rule-name is only supported when exactly one --add-endpoint is provided"},
		{updateFlags{addEndpoints: []string{"a"}}, "--add-endpoint expects host:port[:access[:protocol[:enforcement[:options]]]], got 'a'"},
		{updateFlags{addEndpoints: []string{"a:443:"}}, "--add-endpoint has an empty access segment in 'a:443:'"},
		{updateFlags{addEndpoints: []string{"a:443:read-only::enforce"}}, "--add-endpoint cannot set enforcement without protocol in 'a:443:read-only::enforce'"},
		{updateFlags{addEndpoints: []string{"a:443:all"}}, "--add-endpoint access segment must be one of read-only, read-write, or full; got 'all' in 'a:443:all'"},
		{updateFlags{addEndpoints: []string{"a:443::graphql"}}, "--add-endpoint protocol segment must be 'tcp', 'rest', 'websocket', or 'sql'; got 'graphql'"},
		{updateFlags{addEndpoints: []string{"a:443:full:tcp"}}, "--add-endpoint protocol 'tcp' does not support access or enforcement"},
		{updateFlags{addEndpoints: []string{"a:443::::websocket-credential-rewrite"}}, "websocket-credential-rewrite endpoint option requires --add-endpoint protocol segment to be 'rest' or 'websocket'; got '<empty>'"},
		{updateFlags{addEndpoints: []string{"a:443::::bogus"}}, "--add-endpoint options segment supports only"},
		{updateFlags{addEndpoints: []string{"a:x"}}, "--add-endpoint port segment must be a base-10 integer, got 'x' in 'a:x'"},
		{updateFlags{addEndpoints: []string{"a/b:443"}}, "--add-endpoint host must not contain '/' in 'a/b:443'"},
		{updateFlags{removeEndpoints: []string{"a:1:2"}}, "--remove-endpoint expects host:port, got 'a:1:2'"},
		{updateFlags{addAllow: []string{"a:443:GET"}}, "--add-allow expects host:port:METHOD:path_glob, got 'a:443:GET'"},
		{updateFlags{addDeny: []string{"a:443:GET:x"}}, "--add-deny path must start with '/' or be '**', got 'x' in 'a:443:GET:x'"},
		{updateFlags{removeRules: []string{" "}}, "--remove-rule values must not be empty"},
	} {
		_, err := tc.fl.plan()
		var ue *usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("plan(%+v) = %v, want a usage error containing %q", tc.fl, err, tc.want)
		}
	}
}

// TestCreatePolicyFromEnv: without --policy, sandbox create reads the file
// OPENSHELL_SANDBOX_POLICY names, as OpenShell's CLI does; --policy wins.
// A bad file is refused before anything is sent (the endpoint is
// unreachable, so reaching it would be another error).
func TestCreatePolicyFromEnv(t *testing.T) {
	dir := t.TempDir()
	bad := policyFile(t, dir, "bad.yaml", "version: 1\nfilesystem: {}\n")
	good := policyFile(t, dir, "good.yaml", policyV1)
	tt := newTester(t)
	tt.env["OPENSHELL_SANDBOX_POLICY"] = bad
	args := []string{"--gateway-endpoint", "http://127.0.0.1:1", "sandbox", "create", "--detach", "--name", "x"}
	if r := tt.run(args...); r.err == nil || !strings.HasPrefix(r.err.Error(), "invalid policy file "+bad+": line 2: unknown field \"filesystem\"") {
		t.Errorf("create with OPENSHELL_SANDBOX_POLICY=bad = %v", r.err)
	}
	if r := tt.run(append(args, "--policy", good)...); r.err == nil || !strings.Contains(r.err.Error(), "cannot reach") {
		t.Errorf("create with --policy good = %v, want the gateway to be dialled", r.err)
	}
}
