package gatewaytest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// draftEvents follows the draft_policy_update events of sandbox id.
func draftEvents(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, id string) <-chan *openshellv1.DraftPolicyUpdate {
	t.Helper()
	stream, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: id, FollowEvents: true})
	if err != nil {
		t.Fatalf("WatchSandbox: %v", err)
	}
	out := make(chan *openshellv1.DraftPolicyUpdate, 100)
	go func() { // ends with ctx (the stream fails)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			if u := ev.GetDraftPolicyUpdate(); u != nil {
				out <- u
			}
		}
	}()
	return out
}

// waitDraftEvent waits up to 30 s for a draft update matching ok.
func waitDraftEvent(t *testing.T, events <-chan *openshellv1.DraftPolicyUpdate, what string, ok func(*openshellv1.DraftPolicyUpdate) bool) *openshellv1.DraftPolicyUpdate {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case u := <-events:
			if ok(u) {
				return u
			}
		case <-timeout:
			t.Fatalf("no draft_policy_update for %s within 30s", what)
			return nil
		}
	}
}

// TestPolicyLocal: a real gateway, supervisor and sandbox, with a
// WatchSandbox watcher following events. A denied curl makes a draft
// chunk and the watcher sees a draft_policy_update saying so. Then curl
// inside the sandbox talks to http://policy.local: while
// agent_policy_proposals_enabled is unset it is OpenShell's 404
// feature_disabled and nothing is stored; set on the sandbox, the running
// supervisor picks it up, a proposal becomes an agent-authored draft
// chunk of this sandbox (and a watcher event); a reviewer approves it (a
// watcher event), /wait reports it approved and loaded, and the proposed
// access works without a restart. Set false again, policy.local refuses
// and stores nothing.
func TestPolicyLocal(t *testing.T) {
	curl, port, portN := egressUpstream(t)
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=denied.local.test=127.0.0.1,agent.local.test=127.0.0.1"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"unrelated": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "unrelated.test", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: curl}}},
	})
	id := createEgressSandbox(ctx, t, c, "plocal", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol, Environment: fastAdvisor})
	waitEgressLoaded(ctx, t, c, "plocal", "the proxy enforces the network rules")
	events := draftEvents(ctx, t, c, id)
	run := func(args ...string) string {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: append([]string{curl, "-s", "--max-time", "60"}, args...)})
		if err != nil {
			t.Fatalf("exec curl %v: %v (stderr %q)", args, err, errOut)
		}
		return out
	}
	// policyLocal calls policy.local and returns the status and JSON body.
	policyLocal := func(args ...string) (string, map[string]any) {
		t.Helper()
		out := run(append([]string{"-w", "\n%{http_code}"}, args...)...)
		body, code, _ := strings.Cut(strings.TrimSpace(out), "\n")
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("policy.local %v answered %q: %v", args, out, err)
		}
		return code, m
	}
	chunks := func() []*openshellv1.PolicyChunk {
		t.Helper()
		r, err := c.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: "plocal"})
		if err != nil {
			t.Fatalf("GetDraftPolicy: %v", err)
		}
		return r.GetChunks()
	}

	// A denial makes a chunk; the watcher hears of it.
	if got := run("-o", "/dev/null", "-w", "%{http_code}", "http://denied.local.test:"+port+"/"); got != "403" {
		t.Fatalf("curl denied.local.test = %q, want 403", got)
	}
	denied := waitChunk(ctx, t, c, "plocal", "denied.local.test", func(*openshellv1.PolicyChunk) bool { return true })
	if u := waitDraftEvent(t, events, "the denial's chunk", func(u *openshellv1.DraftPolicyUpdate) bool { return u.GetNewChunks() == 1 }); u.GetTotalPending() != 1 || u.GetDraftVersion() != 1 {
		t.Errorf("draft update after the denial = %v, want 1 new chunk, 1 pending, draft version 1", u)
	}

	proposal := `{"intent_summary": "Allow curl to reach the agent test host.", "operations": [{"addRule": {"ruleName": "agent_local_test", "rule": {
	  "endpoints": [{"host": "agent.local.test", "port": ` + port + `, "allowed_ips": ["127.0.0.1"]}], "binaries": [{"path": "` + curl + `"}]}}}]}`
	submit := []string{"-X", "POST", "-H", "Content-Type: application/json", "--data", proposal, "http://policy.local/v1/proposals"}
	refused := func(when string) {
		t.Helper()
		code, body := policyLocal(submit...)
		if code != "404" || body["error"] != "feature_disabled" || !strings.Contains(body["detail"].(string), "agent_policy_proposals_enabled") {
			t.Errorf("POST policy.local/v1/proposals %s = %s %v, want 404 feature_disabled", when, code, body)
		}
		if n := len(chunks()); n != 1 {
			t.Errorf("%d draft chunks after a refused proposal %s, want only the denial's", n, when)
		}
	}
	refused("while the setting is unset")

	setProposals := func(on bool) {
		t.Helper()
		if _, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "plocal", SettingKey: "agent_policy_proposals_enabled",
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}); err != nil {
			t.Fatalf("UpdateConfig(agent_policy_proposals_enabled %v): %v", on, err)
		}
	}
	setProposals(true)
	// The running supervisor reads the setting with its config poll.
	var code string
	var body map[string]any
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, body = policyLocal("http://policy.local/v1/policy/current"); code == "200" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != "200" || body["format"] != "yaml" || !strings.Contains(body["policy_yaml"].(string), "unrelated.test") {
		t.Fatalf("GET policy.local/v1/policy/current after enabling = %s %v, want the current policy", code, body)
	}
	code, body = policyLocal("http://policy.local/v1/denials?last=5")
	if recent, _ := body["denials"].([]any); code != "200" || len(recent) == 0 || !strings.Contains(recent[0].(string), "DENIED http "+curl+" -> denied.local.test:"+port) {
		t.Errorf("GET policy.local/v1/denials = %s %v, want the curl denial first", code, body)
	}
	code, body = policyLocal(submit...)
	ids, _ := body["accepted_chunk_ids"].([]any)
	if code != "202" || body["status"] != "submitted" || body["accepted_chunks"] != 1.0 || len(ids) != 1 {
		t.Fatalf("POST policy.local/v1/proposals = %s %v, want 202 with one accepted chunk", code, body)
	}
	chunkID := ids[0].(string)
	var agent *openshellv1.PolicyChunk
	for _, ch := range chunks() {
		if ch.GetId() == chunkID {
			agent = ch
		}
	}
	if agent == nil || agent.GetStatus() != "pending" || agent.GetRuleName() != "agent_local_test" || agent.GetBinary() != curl ||
		agent.GetRationale() != "Allow curl to reach the agent test host." || agent.GetProposedRule().GetEndpoints()[0].GetPort() != portN {
		t.Fatalf("draft chunk %s = %v, want the agent's pending proposal", chunkID, agent)
	}
	waitDraftEvent(t, events, "the agent's proposal", func(u *openshellv1.DraftPolicyUpdate) bool { return u.GetNewChunks() == 1 && u.GetTotalPending() == 2 })
	if code, body := policyLocal("http://policy.local/v1/proposals/" + chunkID); code != "200" || body["status"] != "pending" || body["chunk_id"] != chunkID {
		t.Errorf("GET policy.local/v1/proposals/%s = %s %v, want pending", chunkID, code, body)
	}
	if got := run("-o", "/dev/null", "-w", "%{http_code}", "http://agent.local.test:"+port+"/"); got != "403" {
		t.Fatalf("curl agent.local.test before the approval = %q, want 403", got)
	}

	// The reviewer approves; the agent waits for it and retries.
	if _, err := c.ApproveDraftChunk(ctx, &openshellv1.ApproveDraftChunkRequest{Name: "plocal", ChunkId: chunkID, ReviewToken: agent.GetReviewToken()}); err != nil {
		t.Fatalf("ApproveDraftChunk: %v", err)
	}
	waitDraftEvent(t, events, "the approval", func(u *openshellv1.DraftPolicyUpdate) bool {
		return strings.HasPrefix(u.GetSummary(), "chunk "+chunkID+" approved")
	})
	code, body = policyLocal("http://policy.local/v1/proposals/" + chunkID + "/wait?timeout=30")
	if code != "200" || body["status"] != "approved" || body["policy_reloaded"] != true {
		t.Fatalf("GET policy.local/v1/proposals/%s/wait = %s %v, want approved and reloaded", chunkID, code, body)
	}
	if got := run("-o", "/dev/null", "-w", "%{http_code}", "http://agent.local.test:"+port+"/"); got != "200" {
		t.Errorf("curl agent.local.test after the approval = %q, want 200", got)
	}
	if sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "plocal"}); err != nil || sb.GetSandbox().GetMetadata().GetId() != id {
		t.Fatalf("GetSandbox = %v, %v; want the same sandbox %s", sb, err, id)
	}

	// Off again: refused, nothing stored.
	setProposals(false)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, _ = policyLocal("http://policy.local/v1/policy/current"); code == "404" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	before := len(chunks())
	code, body = policyLocal(submit...)
	if code != "404" || body["error"] != "feature_disabled" || len(chunks()) != before {
		t.Errorf("POST policy.local/v1/proposals after disabling = %s %v (%d -> %d chunks), want 404 feature_disabled and nothing stored", code, body, before, len(chunks()))
	}
	if denied.GetStatus() != "pending" {
		t.Errorf("the denial's chunk = %v", denied)
	}
}
