package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
)

// asSupervisor returns a client of the gateway's callback socket that
// authenticates as sandbox id, with the JWT the process driver handed it:
// what the sandbox's supervisor uses to submit its denials.
func asSupervisor(t *testing.T, g *gatewaytest.Gateway, id string) (openshellv1.OpenShellClient, context.Context) {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(g.StateDir, "sandboxes", id, "token"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(g.StateDir, "run", "gateway.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return openshellv1.NewOpenShellClient(conn), metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+strings.TrimSpace(string(tok)))
}

// TestRuleCommandsRealGateway drives 'rule' against the real gateway and a
// real sandbox: denials submitted with the sandbox's own identity become
// draft chunks; the CLI lists them, approves one (a new policy revision the
// supervisor loads), refuses a metadata-host rule, rejects, undoes, edits,
// approves all, clears and shows the history.
func TestRuleCommandsRealGateway(t *testing.T) {
	tt, g := realGatewayTester(t)
	dir := t.TempDir()
	v1 := policyFile(t, dir, "v1.yaml", policyV1)
	if r := tt.run("sandbox", "create", "--name", "adv", "--detach", "--policy", v1, "--", "sleep", "infinity"); r.err != nil {
		t.Fatalf("sandbox create: %v\n%s", r.err, r.stderr)
	}
	var sb struct{ Metadata struct{ Id string } }
	if err := json.Unmarshal([]byte(mustRun(t, tt, "sandbox", "get", "adv", "-o", "json")), &sb); err != nil || sb.Metadata.Id == "" {
		t.Fatalf("sandbox get: %+v %v", sb, err)
	}
	sup, sctx := asSupervisor(t, g, sb.Metadata.Id)
	submit := func(host string, port uint32, binary string) {
		t.Helper()
		if _, err := sup.SubmitPolicyAnalysis(sctx, &openshellv1.SubmitPolicyAnalysisRequest{Name: "adv", AnalysisMode: "mechanistic",
			Summaries: []*openshellv1.DenialSummary{{Host: host, Port: port, Binary: binary, Count: 1, DenyReason: "no matching network policy"}}}); err != nil {
			t.Fatalf("SubmitPolicyAnalysis(%s:%d): %v", host, port, err)
		}
	}
	if out := mustRun(t, tt, "rule", "get", "adv"); out != "No network rules for sandbox 'adv'\n" {
		t.Errorf("rule get (none) = %q", out)
	}
	submit("pypi.org", 443, "/usr/bin/curl")
	submit("pypi.org", 443, "/usr/bin/curl")
	submit("169.254.169.254", 80, "/usr/bin/curl")
	submit("files.example.com", 443, "/usr/bin/wget")

	chunkIDs := func(status string) map[string]string { // host -> chunk id
		t.Helper()
		var resp struct {
			Chunks []struct {
				Id, Status   string
				ProposedRule struct{ Endpoints []struct{ Host string } } `json:"proposed_rule"`
			}
		}
		if err := json.Unmarshal([]byte(mustRun(t, tt, "rule", "get", "adv", "--status", status, "-o", "json")), &resp); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, c := range resp.Chunks {
			if len(c.ProposedRule.Endpoints) > 0 {
				out[c.ProposedRule.Endpoints[0].Host] = c.Id
			}
		}
		return out
	}
	ids := chunkIDs("pending")
	pypi, meta, files := ids["pypi.org"], ids["169.254.169.254"], ids["files.example.com"]
	if len(ids) != 3 || pypi == "" || meta == "" || files == "" {
		t.Fatalf("pending chunks = %v, want pypi.org, 169.254.169.254 and files.example.com", ids)
	}
	out := mustRun(t, tt, "rl", "list", "adv")
	for _, want := range []string{"Network Rules:  (version ", ", 3 chunks)\n", "  Chunk: " + pypi + "\n", "  Status: pending\n",
		"  Binary: /usr/bin/curl\n", "  Endpoints: pypi.org:443 [L4]\n", "  Binaries: /usr/bin/curl\n", "  Hits: 2 (first seen "} {
		if !strings.Contains(out, want) {
			t.Errorf("rule get = %q, want it to contain %q", out, want)
		}
	}

	// Approve: a new revision that the running supervisor loads.
	if out := mustRun(t, tt, "rule", "approve", "adv", "--chunk-id", pypi); !regexp.MustCompile(`^Chunk approved\. Policy version: 2, hash: [0-9a-f]{12}\n$`).MatchString(out) {
		t.Errorf("rule approve = %q", out)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		out := mustRun(t, tt, "policy", "get", "adv", "--rev", "2")
		if field(out, "Status") == "Loaded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("approved revision 2 not loaded by the supervisor: %q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := mustRun(t, tt, "policy", "get", "adv", "--full"); !strings.Contains(out, "host: pypi.org") || !strings.Contains(out, "path: /usr/bin/curl") {
		t.Errorf("policy after approval lacks the rule: %q", out)
	}

	// Refusals. The approval changed the policy, so the other chunks'
	// review tokens are stale: the gateway refreshes them and asks for a new
	// review (as OpenShell's does). Then a metadata host is refused for good.
	if r := tt.run("rule", "approve", "adv", "--chunk-id", meta); r.code() != 1 || !strings.Contains(r.err.Error(), "proposal inputs changed; evaluation refreshed, refetch and review again") {
		t.Errorf("rule approve (stale review) = %v", r.err)
	}
	if r := tt.run("rule", "approve", "adv", "--chunk-id", meta); r.code() != 1 || !strings.Contains(r.err.Error(), "proposed rule endpoint host '169.254.169.254'") {
		t.Errorf("rule approve (metadata host) = %v", r.err)
	}
	// A missing chunk is named as such, not as a missing sandbox.
	for _, verb := range []string{"approve", "reject", "undo"} {
		if r := tt.run("rule", verb, "adv", "--chunk-id", "nope"); r.code() != 1 || r.err.Error() != `draft chunk 'nope' not found in sandbox "adv"` {
			t.Errorf("rule %s --chunk-id nope = %v", verb, r.err)
		}
	}
	if r := tt.run("rule", "reject", "gone", "--chunk-id", "nope"); r.code() != 1 || r.err.Error() != `sandbox "gone" not found in workspace "default"` {
		t.Errorf("rule reject in a missing sandbox = %v", r.err)
	}
	if r := tt.run("rule", "approve", "adv"); r.code() != 2 || !strings.Contains(r.err.Error(), "--chunk-id is required") {
		t.Errorf("rule approve without --chunk-id = %v", r.err)
	}
	if r := tt.run("rule", "get", "nope"); r.code() != 1 || !strings.Contains(r.err.Error(), `sandbox "nope"`) {
		t.Errorf("rule get nope = %v", r.err)
	}

	// Reject with a reason; undo the approval; edit; approve all.
	if out := mustRun(t, tt, "rule", "reject", "adv", "--chunk-id", meta, "--reason", "metadata is off limits"); out != "Chunk rejected.\n" {
		t.Errorf("rule reject = %q", out)
	}
	mustRun(t, tt, "rule", "reject", "adv", "--chunk-id", files)
	if out := mustRun(t, tt, "rule", "get", "adv", "--status", "rejected"); !strings.Contains(out, "  Reason: metadata is off limits\n") || !strings.Contains(out, files) {
		t.Errorf("rule get --status rejected = %q", out)
	}
	if out := mustRun(t, tt, "rule", "undo", "adv", "--chunk-id", pypi); !strings.HasPrefix(out, "Chunk approval undone. Policy version: 3, hash: ") {
		t.Errorf("rule undo = %q", out)
	}
	edited := policyFile(t, dir, "rule.yaml", "endpoints:\n  - host: pypi.org\n    port: 443\n  - host: files.pythonhosted.org\n    port: 443\nbinaries:\n  - path: /usr/bin/curl\n")
	if out := mustRun(t, tt, "rule", "edit", "adv", "--chunk-id", pypi, "--rule", edited); out != "Chunk updated.\n" {
		t.Errorf("rule edit = %q", out)
	}
	if out := mustRun(t, tt, "rule", "get", "adv", "--status", "pending"); !strings.Contains(out, "Endpoints: pypi.org:443 [L4], files.pythonhosted.org:443 [L4]\n") {
		t.Errorf("rule get after edit = %q", out)
	}
	bad := policyFile(t, dir, "bad-rule.yaml", "endpoint:\n  - host: x\n")
	if r := tt.run("rule", "edit", "adv", "--chunk-id", pypi, "--rule", bad); r.code() != 1 || !strings.Contains(r.err.Error(), `line 1: unknown field "endpoint" in a network_policies entry`) {
		t.Errorf("rule edit with a bad file = %v", r.err)
	}
	if out := mustRun(t, tt, "rule", "approve-all", "adv"); out != "1 chunk(s) approved, 0 skipped. Policy version: 4\n" {
		t.Errorf("rule approve-all = %q", out)
	}

	// Clear the pending ones; history lists every event.
	submit("example.org", 443, "/usr/bin/curl")
	if out := mustRun(t, tt, "rule", "clear", "adv"); out != "1 pending chunk(s) cleared.\n" {
		t.Errorf("rule clear = %q", out)
	}
	out = mustRun(t, tt, "rule", "history", "adv")
	for _, want := range []string{"Rule History:\n", " proposed [" + pypi[:8] + "] ", " approved [" + pypi[:8] + "] ", " rejected [" + meta[:8] + "] "} {
		if !strings.Contains(out, want) {
			t.Errorf("rule history = %q, want it to contain %q", out, want)
		}
	}

	r := tt.run("__complete", "rule", "reject", "adv", "--chunk-id", "")
	if got, _, _ := strings.Cut(r.stdout, "Completion ended"); !strings.Contains(got, pypi+"\n") || !strings.HasSuffix(got, ":4\n") {
		t.Errorf("complete --chunk-id = %q", r.stdout)
	}
}
