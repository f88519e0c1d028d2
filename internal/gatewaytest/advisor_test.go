package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// fastAdvisor makes a sandbox's supervisor submit its denials every second
// (OpenShell's variable; the default is 10 s).
var fastAdvisor = map[string]string{"OPENSHELL_DENIAL_FLUSH_INTERVAL_SECS": "1"}

// waitChunk polls the sandbox's draft chunks for up to 30 s until one for
// host matches ok, and returns it.
func waitChunk(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, name, host string, ok func(*openshellv1.PolicyChunk) bool) *openshellv1.PolicyChunk {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last []*openshellv1.PolicyChunk
	for time.Now().Before(deadline) {
		r, err := c.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: name})
		if err != nil {
			t.Fatalf("GetDraftPolicy: %v", err)
		}
		last = r.GetChunks()
		for _, ch := range last {
			if eps := ch.GetProposedRule().GetEndpoints(); len(eps) > 0 && eps[0].GetHost() == host && ok(ch) {
				return ch
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no matching draft chunk for %s within 30s; chunks: %v", host, last)
	return nil
}

// TestPolicyAdvisor: a real gateway, supervisor and sandbox. curl is
// denied a (loopback-mapped) host; the supervisor submits the denial and a
// draft chunk appears whose hit_count grows with repeated denials. The
// reviewer adds the allowed_ips the loopback mapping needs (an advisor
// proposal never carries them: the SSRF guard stays on until someone says
// so), approves, and the running sandbox loads the new version: the next
// curl succeeds without a restart; undo takes the access away again. With
// proposal_approval_mode auto, a
// denial of a cloud metadata hostname is flagged link_local_reach and
// stays pending (and cannot be approved), while a clean proposal is
// approved on arrival.
func TestPolicyAdvisor(t *testing.T) {
	curl, port, portN := egressUpstream(t)
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=denied.advisor.test=127.0.0.1,clean.advisor.test=127.0.0.1,metadata.google.internal=127.0.0.1"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"unrelated": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "unrelated.test", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: curl}}},
	})
	id := createEgressSandbox(ctx, t, c, "advisor", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol, Environment: fastAdvisor})
	waitEgressLoaded(ctx, t, c, "advisor", "the proxy enforces the network rules")
	curlCode := func(host string) string {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://" + host + ":" + port + "/"}})
		if err != nil {
			t.Fatalf("exec curl %s: %v (stderr %q)", host, err, errOut)
		}
		return strings.TrimSpace(out)
	}

	const host = "denied.advisor.test"
	if got := curlCode(host); got != "403" {
		t.Fatalf("curl %s before any approval = %q, want 403", host, got)
	}
	first := waitChunk(ctx, t, c, "advisor", host, func(*openshellv1.PolicyChunk) bool { return true })
	if first.GetStatus() != "pending" || first.GetBinary() != curl || first.GetRuleName() == "" || first.GetProposedRule().GetEndpoints()[0].GetPort() != portN {
		t.Fatalf("draft chunk = %v, want a pending rule for %s:%d and %s", first, host, portN, curl)
	}
	curlCode(host)
	curlCode(host)
	grown := waitChunk(ctx, t, c, "advisor", host, func(ch *openshellv1.PolicyChunk) bool { return ch.GetHitCount() >= 3 })
	if grown.GetId() != first.GetId() {
		t.Fatalf("repeated denials made another chunk %s, want hit_count of %s to grow", grown.GetId(), first.GetId())
	}

	// The reviewer's edit: the name resolves to loopback here.
	rule := proto.Clone(grown.GetProposedRule()).(*sandboxv1.NetworkPolicyRule)
	rule.Endpoints[0].AllowedIps = []string{"127.0.0.1"}
	if _, err := c.EditDraftChunk(ctx, &openshellv1.EditDraftChunkRequest{Name: "advisor", ChunkId: grown.GetId(), ProposedRule: rule}); err != nil {
		t.Fatalf("EditDraftChunk: %v", err)
	}
	edited := waitChunk(ctx, t, c, "advisor", host, func(ch *openshellv1.PolicyChunk) bool { return ch.GetId() == grown.GetId() })
	ap, err := c.ApproveDraftChunk(ctx, &openshellv1.ApproveDraftChunkRequest{Name: "advisor", ChunkId: edited.GetId(), ReviewToken: edited.GetReviewToken()})
	if err != nil || ap.GetPolicyVersion() != 2 {
		t.Fatalf("ApproveDraftChunk = %v, %v; want policy version 2", ap, err)
	}
	if r := waitPolicyStatus(ctx, t, c, "advisor", 2).GetRevision(); r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
		t.Fatalf("version 2 = %v (%q), want LOADED", r.GetStatus(), r.GetLoadError())
	}
	if got := curlCode(host); got != "200" {
		t.Errorf("curl %s after the approval = %q, want 200", host, got)
	}
	if sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "advisor"}); err != nil || sb.GetSandbox().GetMetadata().GetId() != id {
		t.Fatalf("GetSandbox = %v, %v; want the same sandbox %s", sb, err, id)
	}

	// Undo takes the rule out of the running sandbox again; the chunk is
	// pending once more, and a reviewer rejects it.
	un, err := c.UndoDraftChunk(ctx, &openshellv1.UndoDraftChunkRequest{Name: "advisor", ChunkId: edited.GetId()})
	if err != nil || un.GetPolicyVersion() != 3 {
		t.Fatalf("UndoDraftChunk = %v, %v; want policy version 3", un, err)
	}
	if r := waitPolicyStatus(ctx, t, c, "advisor", 3).GetRevision(); r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
		t.Fatalf("version 3 = %v (%q), want LOADED", r.GetStatus(), r.GetLoadError())
	}
	if got := curlCode(host); got != "403" {
		t.Errorf("curl %s after the undo = %q, want 403", host, got)
	}
	if _, err := c.RejectDraftChunk(ctx, &openshellv1.RejectDraftChunkRequest{Name: "advisor", ChunkId: edited.GetId(), Reason: "not needed"}); err != nil {
		t.Fatalf("RejectDraftChunk: %v", err)
	}

	// Auto mode approves only what nothing speaks against.
	if _, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "advisor", SettingKey: "proposal_approval_mode",
		SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: "auto"}}}); err != nil {
		t.Fatalf("UpdateConfig(proposal_approval_mode auto): %v", err)
	}
	curlCode("metadata.google.internal")
	meta := waitChunk(ctx, t, c, "advisor", "metadata.google.internal", func(*openshellv1.PolicyChunk) bool { return true })
	if meta.GetStatus() != "pending" || !strings.Contains(meta.GetValidationResult(), "link_local_reach: metadata.google.internal:"+port+" via "+curl) {
		t.Fatalf("metadata chunk = %v (%q), want pending with a link_local_reach finding", meta.GetStatus(), meta.GetValidationResult())
	}
	_, err = c.ApproveDraftChunk(ctx, &openshellv1.ApproveDraftChunkRequest{Name: "advisor", ChunkId: meta.GetId(), ReviewToken: meta.GetReviewToken()})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is a known cloud metadata hostname") {
		t.Errorf("ApproveDraftChunk(metadata) = %v, want InvalidArgument (metadata host)", err)
	}
	curlCode("clean.advisor.test")
	clean := waitChunk(ctx, t, c, "advisor", "clean.advisor.test", func(ch *openshellv1.PolicyChunk) bool { return ch.GetStatus() == "approved" })
	if clean.GetValidationResult() != "prover: no new findings" {
		t.Errorf("auto-approved chunk validation_result = %q", clean.GetValidationResult())
	}
	if r, err := c.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: "advisor", StatusFilter: "pending"}); err != nil || len(r.GetChunks()) != 1 || r.GetChunks()[0].GetId() != meta.GetId() {
		t.Errorf("pending chunks after auto mode = %v, %v; want only the metadata one", r.GetChunks(), err)
	}
	st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "advisor"})
	if err != nil || st.GetRevision().GetVersion() != 4 || st.GetRevision().GetPolicy().GetNetworkPolicies()["allow_metadata_google_internal_"+port] != nil {
		t.Errorf("newest policy = %v, %v; want version 4 (the clean rule) without the metadata rule", st.GetRevision(), err)
	}
	hist, err := c.GetDraftHistory(ctx, &openshellv1.GetDraftHistoryRequest{Name: "advisor"})
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]int{}
	for _, e := range hist.GetEntries() {
		events[e.GetEventType()]++
	}
	if events["proposed"] != 3 || events["rejected"] != 1 || events["approved"] != 1 {
		t.Errorf("draft history events = %v, want 3 proposed, 1 rejected, 1 approved", events)
	}
}
