package supervisor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/policy/policyfile"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// The sandbox-local policy advisor API (OpenShell's policy.local), served
// by the egress proxy to processes in the sandbox: OpenShell's routes,
// JSON bodies and error texts.
const (
	routePolicyCurrent = "/v1/policy/current"
	routeDenials       = "/v1/denials"
	routeProposals     = "/v1/proposals"

	// agentProposalsKey is the setting that turns the API on.
	agentProposalsKey = "agent_policy_proposals_enabled"
	// analysisModeAgent is the analysis_mode of proposals from the API.
	analysisModeAgent = "agent_authored"

	policyLocalMaxBody     = 64 << 10
	policyLocalBodyTimeout = 15 * time.Second
	policyLocalCallTimeout = 30 * time.Second

	proposalWaitDefault = 60 * time.Second
	proposalWaitMax     = 300 * time.Second
	reloadWaitFloor     = 500 * time.Millisecond
	reloadWaitTick      = 200 * time.Millisecond

	// Recent denials: kept in memory, served newest first.
	denialsKept        = 100
	denialsDefault     = 10
	maxDenialLineBytes = 4096
)

// policyLocalClient is what the API calls on the gateway, as the
// sandbox's own supervisor: a sandbox proposes and reads for itself only.
type policyLocalClient interface {
	SubmitPolicyAnalysis(ctx context.Context, in *openshellv1.SubmitPolicyAnalysisRequest, opts ...grpc.CallOption) (*openshellv1.SubmitPolicyAnalysisResponse, error)
	GetDraftPolicy(ctx context.Context, in *openshellv1.GetDraftPolicyRequest, opts ...grpc.CallOption) (*openshellv1.GetDraftPolicyResponse, error)
}

// policyLocal serves policy.local. Every route answers OpenShell's 404
// feature_disabled unless the sandbox's effective
// agent_policy_proposals_enabled setting is true (read from every config
// poll). It is safe for concurrent use.
type policyLocal struct {
	ctx    context.Context // the supervisor's: gateway calls end with it
	log    *slog.Logger
	client policyLocalClient
	name   string // the sandbox's name, as SubmitPolicyAnalysis takes it
	// poll paces the gateway lookups of a /wait (1 s).
	poll time.Duration

	enabled atomic.Bool
	mu      sync.Mutex
	denials []string // the last denialsKept denial lines, oldest first
	// policy is the newest policy whose network rules the egress proxy
	// installed (nil before the first).
	policy atomic.Pointer[sandboxv1.SandboxPolicy]
}

func newPolicyLocal(ctx context.Context, log *slog.Logger, client policyLocalClient, name string) *policyLocal {
	return &policyLocal{ctx: ctx, log: log, client: client, name: name, poll: time.Second}
}

// setSettings applies the effective settings of a config poll.
func (pl *policyLocal) setSettings(s map[string]*sandboxv1.EffectiveSetting) {
	on := s[agentProposalsKey].GetValue().GetBoolValue()
	if pl.enabled.Swap(on) != on {
		pl.log.Info("policy.local agent proposals "+map[bool]string{true: "enabled", false: "disabled"}[on], "setting", agentProposalsKey)
	}
}

// observe keeps ev when it is a denial (the egress proxy's OnEvent); a
// nil policyLocal keeps nothing. Paths in events never carry a query.
func (pl *policyLocal) observe(ev egress.Event) {
	if pl == nil || ev.Decision != "deny" {
		return
	}
	line := fmt.Sprintf("%s DENIED %s %s -> %s:%d", ev.Time.UTC().Format(time.RFC3339), ev.Kind, cmp.Or(ev.Binary, "-"), ev.Host, ev.Port)
	if ev.Method != "" {
		line += " " + ev.Method
	}
	if ev.Path != "" {
		line += " " + ev.Path
	}
	if ev.Policy != "" {
		line += " policy:" + ev.Policy
	}
	line += " reason: " + ev.Reason
	if len(line) > maxDenialLineBytes {
		line = strings.ToValidUTF8(line[:maxDenialLineBytes], "")
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if len(pl.denials) == denialsKept {
		pl.denials = slices.Delete(pl.denials, 0, 1)
	}
	pl.denials = append(pl.denials, line)
}

// recentDenials answers GET /v1/denials?last=N (default 10, clamped to
// 1..100): the newest denial lines first.
func (pl *policyLocal) recentDenials(last string) (int, jsonBody) {
	n := denialsDefault
	if v, err := strconv.ParseUint(last, 10, 32); err == nil {
		n = int(min(max(v, 1), denialsKept))
	}
	pl.mu.Lock()
	out := make([]string, 0, min(n, len(pl.denials)))
	for i := len(pl.denials) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, pl.denials[i])
	}
	pl.mu.Unlock()
	return http.StatusOK, jsonBody{"denials": out, "log_available": true}
}

// setPolicy records p as the policy the proxy enforces.
func (pl *policyLocal) setPolicy(p *sandboxv1.SandboxPolicy) { pl.policy.Store(p) }

// serve answers one request (the egress proxy's PolicyLocal hook).
func (pl *policyLocal) serve(c net.Conn, req *http.Request, _ egress.Caller) {
	code, body := pl.route(c, req)
	egress.WriteJSON(c, code, body)
}

type jsonBody = map[string]any

func errorBody(kind, detail string) jsonBody { return jsonBody{"error": kind, "detail": detail} }

func (pl *policyLocal) route(c net.Conn, req *http.Request) (int, jsonBody) {
	if !pl.enabled.Load() {
		return http.StatusNotFound, errorBody("feature_disabled", "agent-driven policy proposals are not enabled in this sandbox; set the `agent_policy_proposals_enabled` setting to true to enable")
	}
	path := req.URL.Path
	switch {
	case req.Method == http.MethodGet && path == routePolicyCurrent:
		return pl.current()
	case req.Method == http.MethodGet && path == routeDenials:
		return pl.recentDenials(req.URL.Query().Get("last"))
	case req.Method == http.MethodPost && path == routeProposals:
		body, err := readPolicyLocalBody(c, req)
		if err != nil {
			return http.StatusBadRequest, errorBody("invalid_proposal", err.Error())
		}
		return pl.submit(body)
	case req.Method == http.MethodGet && strings.HasPrefix(path, routeProposals+"/"):
		id, rest, wait := strings.Cut(strings.TrimPrefix(path, routeProposals+"/"), "/")
		if id == "" || (wait && rest != "wait") {
			return http.StatusNotFound, errorBody("not_found", "policy.local proposal sub-route not found: "+path)
		}
		if wait {
			return pl.wait(id, req.URL.Query().Get("timeout"))
		}
		return pl.status(id)
	}
	return http.StatusNotFound, errorBody("not_found", fmt.Sprintf("policy.local route not found: %s %s", req.Method, path))
}

// readPolicyLocalBody reads a request body of at most policyLocalMaxBody
// bytes within policyLocalBodyTimeout.
func readPolicyLocalBody(c net.Conn, req *http.Request) ([]byte, error) {
	if req.ContentLength > policyLocalMaxBody {
		return nil, fmt.Errorf("policy.local request body exceeds %d bytes", policyLocalMaxBody)
	}
	_ = c.SetReadDeadline(time.Now().Add(policyLocalBodyTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	b, err := io.ReadAll(io.LimitReader(req.Body, policyLocalMaxBody+1))
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil, errors.New("policy.local request body read timed out")
	case err != nil:
		return nil, errors.New("policy.local request body ended early")
	case len(b) > policyLocalMaxBody:
		return nil, fmt.Errorf("policy.local request body exceeds %d bytes", policyLocalMaxBody)
	}
	return b, nil
}

func (pl *policyLocal) current() (int, jsonBody) {
	p := pl.policy.Load()
	if p == nil {
		return http.StatusNotFound, errorBody("policy_unavailable", "no current sandbox policy is loaded")
	}
	b, err := policyfile.Marshal(p)
	if err != nil {
		return http.StatusInternalServerError, errorBody("policy_serialize_failed", err.Error())
	}
	return http.StatusOK, jsonBody{"format": "yaml", "policy_yaml": string(b)}
}

// grpcDetail is the message of a gateway error (never its code's prose).
func grpcDetail(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

func (pl *policyLocal) submit(body []byte) (int, jsonBody) {
	chunks, err := proposalChunks(body)
	if err != nil {
		return http.StatusBadRequest, errorBody("invalid_proposal", err.Error())
	}
	ctx, cancel := context.WithTimeout(pl.ctx, policyLocalCallTimeout)
	defer cancel()
	resp, err := pl.client.SubmitPolicyAnalysis(ctx, &openshellv1.SubmitPolicyAnalysisRequest{Name: pl.name, ProposedChunks: chunks, AnalysisMode: analysisModeAgent})
	if err != nil {
		return http.StatusBadGateway, errorBody("proposal_submit_failed", grpcDetail(err))
	}
	for _, id := range resp.GetAcceptedChunkIds() {
		pl.log.Info("agent_authored policy proposal submitted", "chunk_id", id)
	}
	return http.StatusAccepted, jsonBody{
		"status": "submitted", "accepted_chunks": resp.GetAcceptedChunks(), "rejected_chunks": resp.GetRejectedChunks(),
		"rejection_reasons": orEmpty(resp.GetRejectionReasons()), "accepted_chunk_ids": orEmpty(resp.GetAcceptedChunkIds()),
	}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// chunk looks chunk id up among the sandbox's draft chunks (nil: none).
func (pl *policyLocal) chunk(id string) (*openshellv1.PolicyChunk, int, jsonBody) {
	ctx, cancel := context.WithTimeout(pl.ctx, policyLocalCallTimeout)
	defer cancel()
	resp, err := pl.client.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: pl.name})
	if err != nil {
		return nil, http.StatusBadGateway, errorBody("gateway_lookup_failed", grpcDetail(err))
	}
	for _, ch := range resp.GetChunks() {
		if ch.GetId() == id {
			return ch, 0, nil
		}
	}
	return nil, http.StatusNotFound, errorBody("chunk_not_found", fmt.Sprintf("chunk '%s' is not present in this sandbox's draft policy", id))
}

func (pl *policyLocal) status(id string) (int, jsonBody) {
	ch, code, body := pl.chunk(id)
	if ch == nil {
		return code, body
	}
	return http.StatusOK, chunkState(ch, false, false)
}

// wait polls the chunk until it is approved or rejected or the timeout
// (seconds, default 60, clamped to 1..300) passes. An approved chunk is
// answered once the proxy enforces a policy covering its rule
// (policy_reloaded), or when the deadline (at least 500 ms after the
// approval was seen) passes without one.
func (pl *policyLocal) wait(id, timeout string) (int, jsonBody) {
	d := proposalWaitDefault
	if secs, err := strconv.ParseUint(timeout, 10, 64); err == nil {
		d = min(max(time.Duration(min(secs, 1<<20))*time.Second, time.Second), proposalWaitMax)
	}
	deadline := time.Now().Add(d)
	for {
		ch, code, body := pl.chunk(id)
		if ch == nil {
			return code, body
		}
		switch ch.GetStatus() {
		case "approved":
			until := deadline
			if floor := time.Now().Add(reloadWaitFloor); floor.After(until) {
				until = floor
			}
			return http.StatusOK, chunkState(ch, false, pl.waitCovered(ch.GetProposedRule(), until))
		case "rejected":
			return http.StatusOK, chunkState(ch, false, false)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return http.StatusOK, chunkState(ch, true, false)
		}
		select {
		case <-pl.ctx.Done():
			return http.StatusServiceUnavailable, errorBody("gateway_unavailable", "the supervisor is stopping")
		case <-time.After(min(left, pl.poll)):
		}
	}
}

// waitCovered reports whether the proxy enforces a policy covering rule
// before deadline.
func (pl *policyLocal) waitCovered(rule *sandboxv1.NetworkPolicyRule, deadline time.Time) bool {
	for {
		if p := pl.policy.Load(); p != nil && rule != nil && policy.Covers(p, rule) {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 || rule == nil {
			return false
		}
		select {
		case <-pl.ctx.Done():
			return false
		case <-time.After(min(left, reloadWaitTick)):
		}
	}
}

// chunkState is OpenShell's agent-facing view of a chunk.
func chunkState(ch *openshellv1.PolicyChunk, timedOut, reloaded bool) jsonBody {
	b := jsonBody{
		"chunk_id": ch.GetId(), "status": ch.GetStatus(), "rule_name": ch.GetRuleName(), "binary": ch.GetBinary(),
		"rejection_reason": ch.GetRejectionReason(), "validation_result": ch.GetValidationResult(),
		"application_error": ch.GetApplicationError(), "review_token": ch.GetReviewToken(),
		"current_effective_policy_hash": ch.GetCurrentEffectivePolicyHash(), "candidate_effective_policy_hash": ch.GetCandidateEffectivePolicyHash(),
	}
	if timedOut {
		b["timed_out"] = true
	}
	if ch.GetStatus() == "approved" {
		b["policy_reloaded"] = reloaded
	}
	return b
}

// The JSON of POST /v1/proposals (OpenShell's): addRule operations, each
// a narrow NetworkPolicyRule.
type proposalJSON struct {
	IntentSummary string            `json:"intent_summary"`
	Operations    []json.RawMessage `json:"operations"`
}

type addRuleJSON struct {
	RuleName string    `json:"ruleName"`
	Rule     *ruleJSON `json:"rule"`
}

type ruleJSON struct {
	Name      string         `json:"name"`
	Endpoints []endpointJSON `json:"endpoints"`
	Binaries  []struct {
		Path string `json:"path"`
	} `json:"binaries"`
}

type l7JSON struct {
	Method  string `json:"method"`
	Path    string `json:"path"`
	Command string `json:"command"`
}

type endpointJSON struct {
	Host        string   `json:"host"`
	Port        uint32   `json:"port"`
	Ports       []uint32 `json:"ports"`
	Protocol    string   `json:"protocol"`
	TLS         string   `json:"tls"`
	Enforcement string   `json:"enforcement"`
	Access      string   `json:"access"`
	Rules       []struct {
		Allow l7JSON `json:"allow"`
	} `json:"rules"`
	AllowedIPs        []string `json:"allowed_ips"`
	DenyRules         []l7JSON `json:"deny_rules"`
	AllowEncodedSlash bool     `json:"allow_encoded_slash"`
}

// proposalChunks turns a POST /v1/proposals body into draft chunks as
// OpenShell's policy.local does (stage agent, confidence 0.75, the
// intent summary as rationale), with its error texts.
func proposalChunks(body []byte) ([]*openshellv1.PolicyChunk, error) {
	var req proposalJSON
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if len(req.Operations) == 0 {
		return nil, errors.New("proposal requires at least one operation")
	}
	var out []*openshellv1.PolicyChunk
	for _, raw := range req.Operations {
		var op struct {
			AddRule *addRuleJSON `json:"addRule"`
		}
		if err := json.Unmarshal(raw, &op); err != nil {
			return nil, err
		}
		if op.AddRule == nil {
			return nil, errors.New("this MVP accepts `addRule` operations; submit a full narrow NetworkPolicyRule")
		}
		if op.AddRule.Rule == nil {
			return nil, errors.New("missing field `rule`")
		}
		rule, err := op.AddRule.Rule.toProto()
		if err != nil {
			return nil, err
		}
		name := strings.TrimSpace(op.AddRule.RuleName)
		if name == "" {
			name = rule.GetName()
		}
		if strings.TrimSpace(name) == "" {
			return nil, errors.New("addRule.ruleName or rule.name is required")
		}
		if strings.TrimSpace(rule.GetName()) == "" {
			rule.Name = name
		}
		var binary string
		if len(rule.GetBinaries()) > 0 {
			binary = rule.GetBinaries()[0].GetPath()
		}
		out = append(out, &openshellv1.PolicyChunk{
			Status: "pending", RuleName: name, ProposedRule: rule, Rationale: req.IntentSummary,
			Confidence: 0.75, Stage: "agent", HitCount: 1, Binary: binary,
		})
	}
	return out, nil
}

func (r *ruleJSON) toProto() (*sandboxv1.NetworkPolicyRule, error) {
	if len(r.Endpoints) == 0 {
		return nil, errors.New("rule.endpoints must contain at least one endpoint")
	}
	rule := &sandboxv1.NetworkPolicyRule{Name: r.Name}
	for _, e := range r.Endpoints {
		if strings.TrimSpace(e.Host) == "" {
			return nil, errors.New("endpoint.host is required")
		}
		ports := e.Ports
		if len(ports) == 0 && e.Port > 0 {
			ports = []uint32{e.Port}
		}
		if len(ports) == 0 {
			return nil, errors.New("endpoint.port or endpoint.ports is required")
		}
		ep := &sandboxv1.NetworkEndpoint{
			Host: e.Host, Port: ports[0], Ports: ports, Protocol: e.Protocol, Tls: e.TLS, Enforcement: e.Enforcement,
			Access: e.Access, AllowedIps: e.AllowedIPs, AllowEncodedSlash: e.AllowEncodedSlash,
		}
		for _, l7 := range e.Rules {
			if strings.Contains(l7.Allow.Path, "?") {
				return nil, errors.New("L7 allow paths must not include query strings")
			}
			ep.Rules = append(ep.Rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: l7.Allow.Method, Path: l7.Allow.Path, Command: l7.Allow.Command}})
		}
		for _, d := range e.DenyRules {
			ep.DenyRules = append(ep.DenyRules, &sandboxv1.L7DenyRule{Method: d.Method, Path: d.Path, Command: d.Command})
		}
		rule.Endpoints = append(rule.Endpoints, ep)
	}
	for _, b := range r.Binaries {
		rule.Binaries = append(rule.Binaries, &sandboxv1.NetworkBinary{Path: b.Path})
	}
	return rule, nil
}
