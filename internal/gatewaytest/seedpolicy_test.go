package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	policyrules "github.com/openshell-go/openshell/internal/policy"
)

// TestDefaultPolicySeeded: a real gateway and supervisor. A sandbox
// created without a policy gets the supervisor's default one stored as
// version 1; at READY that version is LOADED and current, and the
// supervisor enforces exactly it (the version and hash it logs are the
// stored revision's). The supervisor takes it from UpdateConfig's answer:
// one GetSandboxConfig before its session, not a second one after the
// seed.
func TestDefaultPolicySeeded(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "seed", Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetSandbox().GetMetadata().GetId()
	sb := WaitPhase(ctx, t, c, "seed", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if v := sb.GetStatus().GetCurrentPolicyVersion(); v != 1 {
		t.Errorf("current_policy_version at READY = %d, want 1", v)
	}
	st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "seed"})
	if err != nil {
		t.Fatal(err)
	}
	rev := st.GetRevision()
	if rev.GetVersion() != 1 || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED || st.GetActiveVersion() != 1 {
		t.Errorf("policy status at READY = version %d %v, active %d; want version 1 LOADED, active 1", rev.GetVersion(), rev.GetStatus(), st.GetActiveVersion())
	}
	if fs := rev.GetPolicy().GetFilesystem(); !fs.GetIncludeWorkdir() || len(fs.GetReadOnly()) == 0 || rev.GetPolicy().GetLandlock().GetCompatibility() != "best_effort" {
		t.Errorf("stored policy = %v, want the supervisor's default (workdir, read-only system directories, Landlock best_effort)", rev.GetPolicy())
	}
	if h := policyrules.Hash(rev.GetPolicy()); rev.GetPolicyHash() != h {
		t.Errorf("stored policy_hash = %s, want the hash of the stored policy %s", rev.GetPolicyHash(), h)
	}
	loaded := logFields(ctx, t, c, id, "sandbox configuration loaded")
	if loaded["policy_version"] != "1" || loaded["policy_hash"] != rev.GetPolicyHash() {
		t.Errorf("supervisor loaded policy_version=%s policy_hash=%s, want 1 and %s", loaded["policy_version"], loaded["policy_hash"], rev.GetPolicyHash())
	}

	// The gateway's access log, up to the session: the supervisor's
	// calls by method.
	var calls []string
	for _, line := range strings.Split(g.Logs(), "\n") {
		if strings.Contains(line, "supervisor session accepted") && strings.Contains(line, "sandbox_id="+id) {
			break
		}
		if strings.Contains(line, "msg=rpc") && strings.Contains(line, "principal=spiffe://openshell/sandbox/"+id) {
			if _, m, ok := strings.Cut(line, "method=/openshell.v1.OpenShell/"); ok {
				m, _, _ = strings.Cut(m, " ")
				calls = append(calls, m)
			}
		}
	}
	n := 0
	for _, m := range calls {
		if m == "GetSandboxConfig" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("GetSandboxConfig calls before the session = %d (calls %v), want 1", n, calls)
	}
}

// logFields returns the fields of sandbox id's first log line with
// message msg once the gateway has it.
func logFields(ctx context.Context, tb testing.TB, c openshellv1.OpenShellClient, id, msg string) map[string]string {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Lines: 1000})
		if err != nil {
			tb.Fatal(err)
		}
		for _, l := range resp.GetLogs() {
			if l.GetMessage() == msg {
				return l.GetFields()
			}
		}
	}
	tb.Fatalf("no %q log line for %s", msg, id)
	return nil
}
