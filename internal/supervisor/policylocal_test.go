package supervisor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// fakeDrafts is a gateway's draft inbox of one sandbox.
type fakeDrafts struct {
	mu     sync.Mutex
	submit []*openshellv1.SubmitPolicyAnalysisRequest
	chunks []*openshellv1.PolicyChunk
	gets   int
	// onGet runs on every GetDraftPolicy (under mu), e.g. to decide.
	onGet func(f *fakeDrafts)
}

func (f *fakeDrafts) SubmitPolicyAnalysis(_ context.Context, in *openshellv1.SubmitPolicyAnalysisRequest, _ ...grpc.CallOption) (*openshellv1.SubmitPolicyAnalysisResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submit = append(f.submit, in)
	resp := &openshellv1.SubmitPolicyAnalysisResponse{}
	for _, ch := range in.GetProposedChunks() {
		c := proto.Clone(ch).(*openshellv1.PolicyChunk)
		c.Id = "chunk-" + c.GetRuleName()
		f.chunks = append(f.chunks, c)
		resp.AcceptedChunks++
		resp.AcceptedChunkIds = append(resp.AcceptedChunkIds, c.Id)
	}
	return resp, nil
}

func (f *fakeDrafts) GetDraftPolicy(_ context.Context, in *openshellv1.GetDraftPolicyRequest, _ ...grpc.CallOption) (*openshellv1.GetDraftPolicyResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if in.GetName() != "sb" {
		return nil, io.ErrUnexpectedEOF
	}
	if f.onGet != nil {
		f.onGet(f)
	}
	return &openshellv1.GetDraftPolicyResponse{Chunks: f.chunks}, nil
}

// policyLocalProxy serves pl through a real egress proxy (deny-all policy)
// and returns a client using it.
func policyLocalProxy(t *testing.T, pl *policyLocal) *http.Client {
	t.Helper()
	empty, err := egress.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := egress.New(egress.Config{PolicyLocal: pl.serve}, empty)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func callPolicyLocal(t *testing.T, c *http.Client, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://policy.local"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: %d, body not JSON: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

const githubProposal = `{
  "intent_summary": "Allow gh to update docs.",
  "operations": [{"addRule": {"ruleName": "github_docs", "rule": {
    "endpoints": [{"host": "api.github.com", "port": 443, "protocol": "rest", "enforcement": "enforce",
      "rules": [{"allow": {"method": "PUT", "path": "/repos/o/r/contents/docs/**"}}]}],
    "binaries": [{"path": "/usr/bin/gh"}]}}}]
}`

func enabledSettings(on bool) map[string]*sandboxv1.EffectiveSetting {
	return map[string]*sandboxv1.EffectiveSetting{agentProposalsKey: {Value: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}}
}

// TestPolicyLocalDisabled: while agent_policy_proposals_enabled is not
// true every route is OpenShell's 404 feature_disabled and nothing
// reaches the gateway; the setting turns the API on and off at run time.
func TestPolicyLocalDisabled(t *testing.T) {
	f := &fakeDrafts{}
	pl := newPolicyLocal(t.Context(), slog.New(slog.DiscardHandler), f, "sb")
	c := policyLocalProxy(t, pl)
	for _, s := range []map[string]*sandboxv1.EffectiveSetting{nil, enabledSettings(false)} {
		pl.setSettings(s)
		for _, r := range [][2]string{{"POST", "/v1/proposals"}, {"GET", "/v1/policy/current"}, {"GET", "/v1/proposals/x"}, {"GET", "/nope"}} {
			code, body := callPolicyLocal(t, c, r[0], r[1], githubProposal)
			if code != http.StatusNotFound || body["error"] != "feature_disabled" || !strings.Contains(body["detail"].(string), "`agent_policy_proposals_enabled` setting to true") {
				t.Errorf("%s %s while disabled = %d %v, want 404 feature_disabled", r[0], r[1], code, body)
			}
		}
	}
	if len(f.submit) != 0 || f.gets != 0 {
		t.Errorf("disabled policy.local called the gateway: %d submissions, %d lookups", len(f.submit), f.gets)
	}
	pl.setSettings(enabledSettings(true))
	if code, _ := callPolicyLocal(t, c, "POST", "/v1/proposals", githubProposal); code != http.StatusAccepted || len(f.submit) != 1 {
		t.Fatalf("POST /v1/proposals once enabled = %d (%d submissions), want 202", code, len(f.submit))
	}
	pl.setSettings(enabledSettings(false))
	if code, _ := callPolicyLocal(t, c, "POST", "/v1/proposals", githubProposal); code != http.StatusNotFound || len(f.submit) != 1 {
		t.Errorf("POST /v1/proposals disabled again = %d (%d submissions), want 404 and no submission", code, len(f.submit))
	}
}

// TestPolicyLocalProposals: a proposal is submitted as OpenShell's
// agent_authored chunk of the sandbox itself; malformed proposals are
// 400 with OpenShell's texts and submit nothing; status, wait (approved
// once the proxy enforces a covering policy, rejected with its reason,
// timed out), current policy and unknown routes.
func TestPolicyLocalProposals(t *testing.T) {
	f := &fakeDrafts{}
	pl := newPolicyLocal(t.Context(), slog.New(slog.DiscardHandler), f, "sb")
	pl.poll = 10 * time.Millisecond
	pl.setSettings(enabledSettings(true))
	c := policyLocalProxy(t, pl)

	code, body := callPolicyLocal(t, c, "POST", "/v1/proposals", githubProposal)
	want := map[string]any{"status": "submitted", "accepted_chunks": 1.0, "rejected_chunks": 0.0, "rejection_reasons": []any{}, "accepted_chunk_ids": []any{"chunk-github_docs"}}
	if code != http.StatusAccepted || !cmp.Equal(body, want) {
		t.Fatalf("POST /v1/proposals = %d %v, want 202 %v", code, body, want)
	}
	wantRule := &sandboxv1.NetworkPolicyRule{
		Name: "github_docs",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Ports: []uint32{443}, Protocol: "rest", Enforcement: "enforce",
			Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "PUT", Path: "/repos/o/r/contents/docs/**"}}}}},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/gh"}},
	}
	wantReq := &openshellv1.SubmitPolicyAnalysisRequest{Name: "sb", AnalysisMode: "agent_authored", ProposedChunks: []*openshellv1.PolicyChunk{{
		Status: "pending", RuleName: "github_docs", ProposedRule: wantRule, Rationale: "Allow gh to update docs.", Confidence: 0.75, Stage: "agent", HitCount: 1, Binary: "/usr/bin/gh",
	}}}
	if diff := cmp.Diff(wantReq, f.submit[0], protocmp.Transform()); diff != "" {
		t.Errorf("SubmitPolicyAnalysis request (-want +got):\n%s", diff)
	}

	for _, tc := range []struct{ body, detail string }{
		{`{"operations": []}`, "proposal requires at least one operation"},
		{`{"operations": [{"removeRule": {}}]}`, "this MVP accepts `addRule` operations; submit a full narrow NetworkPolicyRule"},
		{`{"operations": [{"addRule": {"rule": {"endpoints": [{"host": "a.test", "port": 443}]}}}]}`, "addRule.ruleName or rule.name is required"},
		{`{"operations": [{"addRule": {"ruleName": "r", "rule": {"endpoints": []}}}]}`, "rule.endpoints must contain at least one endpoint"},
		{`{"operations": [{"addRule": {"ruleName": "r", "rule": {"endpoints": [{"host": "a.test"}]}}}]}`, "endpoint.port or endpoint.ports is required"},
		{`{"operations": [{"addRule": {"ruleName": "r", "rule": {"endpoints": [{"host": "a.test", "port": 80, "rules": [{"allow": {"method": "GET", "path": "/x?y=1"}}]}]}}}]}`, "L7 allow paths must not include query strings"},
		{`not json`, ""},
		{strings.Repeat(" ", policyLocalMaxBody+1), "policy.local request body exceeds 65536 bytes"},
	} {
		code, body := callPolicyLocal(t, c, "POST", "/v1/proposals", tc.body)
		if code != http.StatusBadRequest || body["error"] != "invalid_proposal" || (tc.detail != "" && body["detail"] != tc.detail) {
			t.Errorf("POST %.40q = %d %v, want 400 invalid_proposal %q", tc.body, code, body, tc.detail)
		}
	}
	if len(f.submit) != 1 {
		t.Errorf("%d submissions, want the malformed proposals not submitted", len(f.submit))
	}

	code, body = callPolicyLocal(t, c, "GET", "/v1/proposals/chunk-github_docs", "")
	if code != http.StatusOK || body["status"] != "pending" || body["rule_name"] != "github_docs" || body["binary"] != "/usr/bin/gh" || body["policy_reloaded"] != nil {
		t.Errorf("GET /v1/proposals/chunk-github_docs = %d %v, want 200 pending", code, body)
	}
	code, body = callPolicyLocal(t, c, "GET", "/v1/proposals/nope", "")
	if code != http.StatusNotFound || body["error"] != "chunk_not_found" || body["detail"] != "chunk 'nope' is not present in this sandbox's draft policy" {
		t.Errorf("GET /v1/proposals/nope = %d %v", code, body)
	}
	code, body = callPolicyLocal(t, c, "GET", "/v1/proposals/chunk-github_docs/wait?timeout=1", "")
	if code != http.StatusOK || body["status"] != "pending" || body["timed_out"] != true {
		t.Errorf("wait on a pending chunk = %d %v, want timed_out", code, body)
	}

	// Approved on the third lookup; the proxy installs a covering policy
	// a little later: policy_reloaded once it does.
	f.mu.Lock()
	f.gets = 0
	f.onGet = func(f *fakeDrafts) {
		if f.gets == 3 {
			f.chunks[0].Status = "approved"
			time.AfterFunc(50*time.Millisecond, func() {
				pl.setPolicy(&sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"github_docs": wantRule}})
			})
		}
	}
	f.mu.Unlock()
	code, body = callPolicyLocal(t, c, "GET", "/v1/proposals/chunk-github_docs/wait?timeout=30", "")
	if code != http.StatusOK || body["status"] != "approved" || body["policy_reloaded"] != true || body["timed_out"] != nil {
		t.Errorf("wait on an approval = %d %v, want approved with policy_reloaded", code, body)
	}
	code, body = callPolicyLocal(t, c, "GET", "/v1/policy/current", "")
	if code != http.StatusOK || body["format"] != "yaml" || !strings.Contains(body["policy_yaml"].(string), "api.github.com") {
		t.Errorf("GET /v1/policy/current = %d %v", code, body)
	}

	f.mu.Lock()
	f.onGet = nil
	f.chunks[0].Status, f.chunks[0].RejectionReason = "rejected", "scope it to docs/ only"
	f.mu.Unlock()
	code, body = callPolicyLocal(t, c, "GET", "/v1/proposals/chunk-github_docs/wait", "")
	if code != http.StatusOK || body["status"] != "rejected" || body["rejection_reason"] != "scope it to docs/ only" {
		t.Errorf("wait on a rejection = %d %v", code, body)
	}

	for _, r := range [][2]string{{"GET", "/v1/nope"}, {"DELETE", "/v1/proposals"}, {"GET", "/v1/proposals/x/y"}, {"GET", "/v1/proposals/"}} {
		if code, body := callPolicyLocal(t, c, r[0], r[1], ""); code != http.StatusNotFound || body["error"] != "not_found" {
			t.Errorf("%s %s = %d %v, want 404 not_found", r[0], r[1], code, body)
		}
	}
}

// TestPolicyLocalDenials: GET /v1/denials serves the proxy's latest
// denials (never its allows), newest first, last=N lines (default 10,
// at most 100 kept and served).
func TestPolicyLocalDenials(t *testing.T) {
	pl := newPolicyLocal(t.Context(), slog.New(slog.DiscardHandler), &fakeDrafts{}, "sb")
	pl.setSettings(enabledSettings(true))
	c := policyLocalProxy(t, pl)
	at := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	for i := range 105 {
		pl.observe(egress.Event{Time: at, Kind: "connect", Binary: "/usr/bin/curl", Host: "h" + strconv.Itoa(i) + ".test", Port: 443, Decision: "deny", Reason: "no matching network policy"})
		pl.observe(egress.Event{Time: at, Kind: "connect", Binary: "/usr/bin/curl", Host: "ok.test", Port: 443, Decision: "allow", Policy: "ok"})
	}
	pl.observe(egress.Event{Time: at, Kind: "http", Binary: "/usr/bin/python3", Host: "api.test", Port: 80, Method: "DELETE", Path: "/v1/x", Policy: "api", Decision: "deny", Reason: "method not allowed"})
	lines := func(query string) []any {
		t.Helper()
		code, body := callPolicyLocal(t, c, "GET", "/v1/denials"+query, "")
		if code != http.StatusOK || body["log_available"] != true {
			t.Fatalf("GET /v1/denials%s = %d %v", query, code, body)
		}
		return body["denials"].([]any)
	}
	got := lines("?last=2")
	want := []any{
		"2026-12-01T18:00:00Z DENIED http /usr/bin/python3 -> api.test:80 DELETE /v1/x policy:api reason: method not allowed",
		"2026-12-01T18:00:00Z DENIED connect /usr/bin/curl -> h104.test:443 reason: no matching network policy",
	}
	if !cmp.Equal(got, want) {
		t.Errorf("GET /v1/denials?last=2 = %q, want %q", got, want)
	}
	if n := len(lines("")); n != 10 {
		t.Errorf("GET /v1/denials = %d lines, want the default 10", n)
	}
	all := lines("?last=1000")
	if len(all) != 100 || all[99] != "2026-12-01T18:00:00Z DENIED connect /usr/bin/curl -> h6.test:443 reason: no matching network policy" {
		t.Errorf("GET /v1/denials?last=1000 = %d lines ending %q, want the 100 kept", len(all), all[len(all)-1])
	}
	for _, l := range all {
		if strings.Contains(l.(string), "ok.test") {
			t.Errorf("an allowed connection is served as a denial: %q", l)
		}
	}
}
