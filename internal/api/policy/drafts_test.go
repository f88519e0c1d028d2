package policy_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/policy"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func denial(binary, host string, port, count uint32) *openshellv1.DenialSummary {
	return &openshellv1.DenialSummary{Binary: binary, Host: host, Port: port, Count: count, DenyReason: "no matching network policy"}
}

func submit(t *testing.T, svc *policy.Service, id string, sums ...*openshellv1.DenialSummary) *openshellv1.SubmitPolicyAnalysisResponse {
	t.Helper()
	r, err := svc.SubmitPolicyAnalysis(apitest.As(t.Context(), apitest.Sandbox(id)), &openshellv1.SubmitPolicyAnalysisRequest{Name: "pol", Summaries: sums, AnalysisMode: "mechanistic"})
	if err != nil {
		t.Fatalf("SubmitPolicyAnalysis: %v", err)
	}
	return r
}

func drafts(t *testing.T, svc *policy.Service, status string) []*openshellv1.PolicyChunk {
	t.Helper()
	r, err := svc.GetDraftPolicy(apitest.As(t.Context(), apitest.OIDCUser("ua")), &openshellv1.GetDraftPolicyRequest{Name: "pol", Workspace: "team-a", StatusFilter: status})
	if err != nil {
		t.Fatalf("GetDraftPolicy: %v", err)
	}
	return r.GetChunks()
}

// TestDraftLifecycle: denials become one chunk per (host, port, binary)
// whose hit_count adds up; approving it adds the rule as a new policy
// revision; undo takes it out again; reject and clear.
func TestDraftLifecycle(t *testing.T) {
	svc, _, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	r := submit(t, svc, id, denial("/usr/bin/curl", "Data.Example.com", 443, 2), denial("/usr/bin/curl", "api.other.com", 8443, 1))
	if r.GetAcceptedChunks() != 2 || len(r.GetAcceptedChunkIds()) != 2 {
		t.Fatalf("first submit = %v, want 2 accepted", r)
	}
	again := submit(t, svc, id, denial("/usr/bin/curl", "data.example.com", 443, 3))
	if again.GetAcceptedChunkIds()[0] != r.GetAcceptedChunkIds()[0] {
		t.Fatalf("repeat denial made chunk %v, want the existing %v", again.GetAcceptedChunkIds(), r.GetAcceptedChunkIds()[0])
	}
	cs := drafts(t, svc, "pending")
	if len(cs) != 2 {
		t.Fatalf("pending chunks = %v, want 2", cs)
	}
	c := cs[0]
	if c.GetRuleName() != "allow_data_example_com_443" {
		c = cs[1]
	}
	if c.GetId() != r.GetAcceptedChunkIds()[0] || c.GetHitCount() != 5 || c.GetRuleName() != "allow_data_example_com_443" ||
		c.GetBinary() != "/usr/bin/curl" || c.GetValidationResult() != "prover: no new findings" || c.GetReviewToken() == "" {
		t.Fatalf("chunk = %v, want allow_data_example_com_443 for curl with 5 hits, no findings, a review token", c)
	}
	if ep := c.GetProposedRule().GetEndpoints(); len(ep) != 1 || ep[0].GetHost() != "data.example.com" || ep[0].GetPort() != 443 {
		t.Fatalf("proposed endpoints = %v", ep)
	}

	_, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), ReviewToken: "stale"})
	apitest.WantErr(t, "ApproveDraftChunk(wrong token)", err, codes.FailedPrecondition, "review token does not match the fetched proposal; refetch and review again")
	ap, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()})
	if err != nil || ap.GetPolicyVersion() != 2 {
		t.Fatalf("ApproveDraftChunk = %v, %v; want version 2", ap, err)
	}
	st := status(apitest.As(t.Context(), apitest.OIDCUser("ua")), t, svc, 0)
	rule := st.GetRevision().GetPolicy().GetNetworkPolicies()["allow_data_example_com_443"]
	if rule == nil || rule.GetBinaries()[0].GetPath() != "/usr/bin/curl" || st.GetRevision().GetPolicy().GetNetworkPolicies()["gh"] == nil {
		t.Fatalf("policy after approve = %v, want gh and the new rule", st.GetRevision().GetPolicy())
	}
	_, err = svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()})
	apitest.WantErr(t, "ApproveDraftChunk(again)", err, codes.FailedPrecondition, "chunk status is 'approved', expected 'pending' or 'rejected'")

	// The other chunk's token was minted for version 1: stale now.
	other := drafts(t, svc, "pending")[0]
	_, err = svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: other.GetId(), ReviewToken: other.GetReviewToken()})
	apitest.WantErr(t, "ApproveDraftChunk(policy moved)", err, codes.FailedPrecondition, "proposal inputs changed; evaluation refreshed, refetch and review again")

	un, err := svc.UndoDraftChunk(admin, &openshellv1.UndoDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId()})
	if err != nil || un.GetPolicyVersion() != 3 {
		t.Fatalf("UndoDraftChunk = %v, %v; want version 3", un, err)
	}
	if p := status(admin, t, svc, 0).GetRevision().GetPolicy(); p.GetNetworkPolicies()["allow_data_example_com_443"] != nil {
		t.Fatalf("policy after undo still has the rule: %v", p)
	}
	if _, err := svc.RejectDraftChunk(admin, &openshellv1.RejectDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), Reason: "too broad"}); err != nil {
		t.Fatal(err)
	}
	rej := drafts(t, svc, "rejected")
	if len(rej) != 1 || rej[0].GetRejectionReason() != "too broad" || rej[0].GetDecidedAtMs() == 0 {
		t.Fatalf("rejected chunks = %v", rej)
	}
	hist, err := svc.GetDraftHistory(apitest.As(t.Context(), apitest.OIDCUser("ua")), &openshellv1.GetDraftHistoryRequest{Name: "pol", Workspace: "team-a"})
	if err != nil || len(hist.GetEntries()) != 3 || hist.GetEntries()[0].GetEventType() != "proposed" || hist.GetEntries()[2].GetEventType() != "rejected" {
		t.Fatalf("GetDraftHistory = %v, %v; want 2 proposals and a rejection", hist, err)
	}
	cl, err := svc.ClearDraftChunks(admin, &openshellv1.ClearDraftChunksRequest{Name: "pol", Workspace: "team-a"})
	if err != nil || cl.GetChunksCleared() != 1 || len(drafts(t, svc, "")) != 1 {
		t.Fatalf("ClearDraftChunks = %v, %v; want the one pending chunk cleared, the rejected kept", cl, err)
	}
}

// TestSubmitBounds: oversized rules and calls are refused.
func TestSubmitBounds(t *testing.T) {
	svc, _, id := setup(t)
	sup := apitest.As(t.Context(), apitest.Sandbox(id))
	big := &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "a.test", Port: 443, AllowedIps: make([]string, 3000)}}}
	for i := range big.Endpoints[0].AllowedIps {
		big.Endpoints[0].AllowedIps[i] = "10.0.0.1"
	}
	r, err := svc.SubmitPolicyAnalysis(sup, &openshellv1.SubmitPolicyAnalysisRequest{Name: "pol", AnalysisMode: "agent_authored", ProposedChunks: []*openshellv1.PolicyChunk{
		{RuleName: "big", ProposedRule: big}, {RuleName: "_provider_x", ProposedRule: big}, {RuleName: "none"},
	}})
	if err != nil || r.GetAcceptedChunks() != 0 || len(r.GetRejectionReasons()) != 3 || r.GetRejectionReasons()[0] != "chunk 'big': proposed_rule exceeds 16384 bytes" ||
		r.GetRejectionReasons()[1] != "chunk '_provider_x' uses reserved '_provider_' rule-name prefix" || r.GetRejectionReasons()[2] != "chunk 'none' missing proposed_rule" {
		t.Fatalf("SubmitPolicyAnalysis = %v, %v; want three rejections", r, err)
	}
	many := make([]*openshellv1.DenialSummary, 257)
	for i := range many {
		many[i] = denial("/usr/bin/curl", "a.test", uint32(1000+i), 1)
	}
	_, err = svc.SubmitPolicyAnalysis(sup, &openshellv1.SubmitPolicyAnalysisRequest{Name: "pol", Summaries: many})
	apitest.WantErr(t, "SubmitPolicyAnalysis(257 summaries)", err, codes.InvalidArgument, "too many summaries and proposed chunks (257 > 256)")
}

// TestApproveAll: chunks bound to their tokens are approved in one
// revision; a flagged chunk (a database port) and a chunk without its
// token are skipped, unless include_security_flagged for the former.
func TestApproveAll(t *testing.T) {
	svc, _, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	submit(t, svc, id, denial("/usr/bin/curl", "a.test", 443, 1), denial("/usr/bin/curl", "b.test", 443, 1), denial("/usr/bin/psql", "db.test", 5432, 1))
	var approvals []*openshellv1.DraftChunkApproval
	var flagged string
	for _, c := range drafts(t, svc, "pending") {
		switch c.GetRuleName() {
		case "allow_db_test_5432":
			flagged = c.GetId()
			if c.GetSecurityNotes() != "Port 5432 is a well-known database/service port." {
				t.Errorf("security notes = %q", c.GetSecurityNotes())
			}
			approvals = append(approvals, &openshellv1.DraftChunkApproval{ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()})
		case "allow_b_test_443":
			approvals = append(approvals, &openshellv1.DraftChunkApproval{ChunkId: c.GetId()}) // no token
		default:
			approvals = append(approvals, &openshellv1.DraftChunkApproval{ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()})
		}
	}
	r, err := svc.ApproveAllDraftChunks(admin, &openshellv1.ApproveAllDraftChunksRequest{Name: "pol", Workspace: "team-a", Approvals: approvals})
	if err != nil || r.GetChunksApproved() != 1 || r.GetChunksSkipped() != 2 || r.GetPolicyVersion() != 2 {
		t.Fatalf("ApproveAllDraftChunks = %v, %v; want a.test approved in version 2, 2 skipped", r, err)
	}
	token := func() string {
		for _, c := range drafts(t, svc, "pending") {
			if c.GetId() == flagged {
				return c.GetReviewToken()
			}
		}
		return ""
	}
	// The token was minted before version 2: the chunk is re-evaluated
	// and skipped; the refreshed token is then accepted.
	r, err = svc.ApproveAllDraftChunks(admin, &openshellv1.ApproveAllDraftChunksRequest{Name: "pol", Workspace: "team-a", IncludeSecurityFlagged: true,
		Approvals: []*openshellv1.DraftChunkApproval{{ChunkId: flagged, ReviewToken: token()}}})
	if err != nil || r.GetChunksApproved() != 0 || r.GetChunksSkipped() != 1 {
		t.Fatalf("ApproveAllDraftChunks(stale token) = %v, %v; want it skipped", r, err)
	}
	r, err = svc.ApproveAllDraftChunks(admin, &openshellv1.ApproveAllDraftChunksRequest{Name: "pol", Workspace: "team-a", IncludeSecurityFlagged: true,
		Approvals: []*openshellv1.DraftChunkApproval{{ChunkId: flagged, ReviewToken: token()}}})
	if err != nil || r.GetChunksApproved() != 1 || r.GetPolicyVersion() != 3 {
		t.Fatalf("ApproveAllDraftChunks(include_security_flagged) = %v, %v; want the database rule in version 3", r, err)
	}
	p := status(admin, t, svc, 0).GetRevision().GetPolicy()
	if p.GetNetworkPolicies()["allow_a_test_443"] == nil || p.GetNetworkPolicies()["allow_db_test_5432"] == nil || p.GetNetworkPolicies()["allow_b_test_443"] != nil {
		t.Errorf("policy after bulk approvals = %v", p)
	}
	_, err = svc.ApproveAllDraftChunks(admin, &openshellv1.ApproveAllDraftChunksRequest{Name: "pol", Workspace: "team-a", Approvals: []*openshellv1.DraftChunkApproval{{ChunkId: flagged}}})
	apitest.WantErr(t, "ApproveAllDraftChunks(approved chunk)", err, codes.FailedPrecondition, "is not pending; refetch before bulk approval")
}

// TestAgentProposals: proposals other than mechanistic ones each make a
// chunk and supersede older pending ones for the same (host, port,
// binary); one that cannot apply is rejected; a later mechanistic
// proposal already covered by an approved chunk is rejected at once.
func TestAgentProposals(t *testing.T) {
	svc, _, id := setup(t)
	sup := apitest.As(t.Context(), apitest.Sandbox(id))
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	rule := func(path string) *sandboxv1.NetworkPolicyRule {
		return &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.example.com", Port: 443, Protocol: "rest",
			Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: path}}}}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}
	}
	agent := func(name string, r *sandboxv1.NetworkPolicyRule) *openshellv1.SubmitPolicyAnalysisResponse {
		t.Helper()
		resp, err := svc.SubmitPolicyAnalysis(sup, &openshellv1.SubmitPolicyAnalysisRequest{Name: "pol", AnalysisMode: "agent_authored",
			ProposedChunks: []*openshellv1.PolicyChunk{{RuleName: name, ProposedRule: r, Rationale: "needed", Confidence: 0.9}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := agent("docs", rule("/docs/**")).GetAcceptedChunkIds()[0]
	second := agent("docs_narrow", rule("/docs/a")).GetAcceptedChunkIds()[0]
	rej := drafts(t, svc, "rejected")
	if len(rej) != 1 || rej[0].GetId() != first || rej[0].GetRejectionReason() != "superseded by chunk "+second {
		t.Fatalf("rejected = %v, want the first proposal superseded by %s", rej, second)
	}
	bad := rule("/x")
	bad.Endpoints[0].Host = "*.com"
	if r := agent("bad", bad); r.GetRejectedChunks() != 1 || !strings.Contains(r.GetRejectionReasons()[0], "chunk 'bad': policy invalid: ") {
		t.Fatalf("invalid proposal = %v, want rejected as policy invalid", r)
	}
	var c *openshellv1.PolicyChunk
	for _, x := range drafts(t, svc, "pending") {
		c = x
	}
	if _, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()}); err != nil {
		t.Fatal(err)
	}
	mech := submit(t, svc, id, denial("/usr/bin/curl", "api.example.com", 443, 1)).GetAcceptedChunkIds()[0]
	for _, x := range drafts(t, svc, "rejected") {
		if x.GetId() == mech && x.GetRejectionReason() == "already covered by approved chunk "+second {
			return
		}
	}
	t.Fatalf("mechanistic chunk %s not rejected as covered by %s: %v", mech, second, drafts(t, svc, ""))
}

// TestApprovalRejectsCoveredChunks: once a revision grants what a pending
// chunk asks for, the chunk is rejected as covered.
func TestApprovalRejectsCoveredChunks(t *testing.T) {
	svc, _, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	r := submit(t, svc, id, denial("/usr/bin/curl", "a.test", 443, 1), denial("/usr/bin/curl", "b.test", 443, 1))
	a, b := r.GetAcceptedChunkIds()[0], r.GetAcceptedChunkIds()[1]
	same := &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "a.test", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}
	if _, err := svc.EditDraftChunk(admin, &openshellv1.EditDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: b, ProposedRule: same}); err != nil {
		t.Fatal(err)
	}
	var token string
	for _, c := range drafts(t, svc, "pending") {
		if c.GetId() == a {
			token = c.GetReviewToken()
		}
	}
	if _, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: a, ReviewToken: token}); err != nil {
		t.Fatal(err)
	}
	rej := drafts(t, svc, "rejected")
	if len(rej) != 1 || rej[0].GetId() != b || rej[0].GetRejectionReason() != "covered by active policy revision 2" {
		t.Fatalf("rejected = %v, want the edited chunk covered by revision 2", rej)
	}
}

// TestDraftFlagsMetadataAndNeverAutoApproves: with proposal_approval_mode
// auto, a clean proposal is approved on arrival, a metadata host is
// flagged link_local_reach, stays pending and cannot be approved.
func TestDraftFlagsMetadataAndNeverAutoApproves(t *testing.T) {
	svc, _, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	if _, err := svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "proposal_approval_mode", SettingValue: stringSetting("auto")}); err != nil {
		t.Fatal(err)
	}
	submit(t, svc, id, denial("/usr/bin/curl", "pypi.org", 443, 1))
	submit(t, svc, id, denial("/usr/bin/curl", "metadata.google.internal", 80, 1), denial("/usr/bin/curl", "169.254.169.254", 80, 1))
	pending := drafts(t, svc, "pending")
	if len(pending) != 2 {
		t.Fatalf("pending = %v, want the two metadata chunks", pending)
	}
	for _, c := range pending {
		if !strings.Contains(c.GetValidationResult(), "prover: 1 new finding\n  link_local_reach: ") {
			t.Errorf("chunk %s validation_result = %q, want a link_local_reach finding", c.GetRuleName(), c.GetValidationResult())
		}
		_, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: c.GetId(), ReviewToken: c.GetReviewToken()})
		if code := errdefs.Code(err); code != codes.InvalidArgument || !strings.Contains(err.Error(), "the proxy will deny traffic to this destination regardless of policy") {
			t.Errorf("ApproveDraftChunk(%s) = %v, want InvalidArgument always-blocked", c.GetRuleName(), err)
		}
	}
	if a := drafts(t, svc, "approved"); len(a) != 1 || a[0].GetRuleName() != "allow_pypi_org_443" {
		t.Fatalf("approved = %v, want pypi auto-approved", a)
	}
}

// TestDraftAuthorization: SubmitPolicyAnalysis for the supervisor's own
// sandbox only; GetDraftPolicy for its supervisor and workspace users;
// history for users; decisions for workspace admins.
func TestDraftAuthorization(t *testing.T) {
	svc, f, id := setup(t)
	chunk := submit(t, svc, id, denial("/usr/bin/curl", "pypi.org", 443, 1)).GetAcceptedChunkIds()[0]
	ws := "team-a"
	rule := &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/pip"}}}
	calls := []apitest.Call{
		{Name: "SubmitPolicyAnalysis", Do: func(ctx context.Context) error {
			_, err := svc.SubmitPolicyAnalysis(ctx, &openshellv1.SubmitPolicyAnalysisRequest{Name: "pol", Workspace: ws})
			return err
		}},
		{Name: "GetDraftPolicy", Do: func(ctx context.Context) error {
			_, err := svc.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: "pol", Workspace: ws})
			return err
		}},
		{Name: "GetDraftHistory", Do: func(ctx context.Context) error {
			_, err := svc.GetDraftHistory(ctx, &openshellv1.GetDraftHistoryRequest{Name: "pol", Workspace: ws})
			return err
		}},
		{Name: "EditDraftChunk", Do: func(ctx context.Context) error {
			_, err := svc.EditDraftChunk(ctx, &openshellv1.EditDraftChunkRequest{Name: "pol", Workspace: ws, ChunkId: chunk, ProposedRule: rule})
			return err
		}},
		{Name: "ApproveDraftChunk", Do: func(ctx context.Context) error {
			_, err := svc.ApproveDraftChunk(ctx, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: ws, ChunkId: chunk, ReviewToken: "x"})
			return err
		}},
		{Name: "ApproveAllDraftChunks", Do: func(ctx context.Context) error {
			_, err := svc.ApproveAllDraftChunks(ctx, &openshellv1.ApproveAllDraftChunksRequest{Name: "pol", Workspace: ws, Approvals: []*openshellv1.DraftChunkApproval{{ChunkId: chunk, ReviewToken: "x"}}})
			return err
		}},
		{Name: "UndoDraftChunk", Do: func(ctx context.Context) error {
			_, err := svc.UndoDraftChunk(ctx, &openshellv1.UndoDraftChunkRequest{Name: "pol", Workspace: ws, ChunkId: chunk})
			return err
		}},
		{Name: "RejectDraftChunk", Do: func(ctx context.Context) error {
			_, err := svc.RejectDraftChunk(ctx, &openshellv1.RejectDraftChunkRequest{Name: "pol", Workspace: ws, ChunkId: chunk})
			return err
		}},
		{Name: "ClearDraftChunks", Do: func(ctx context.Context) error {
			_, err := svc.ClearDraftChunks(ctx, &openshellv1.ClearDraftChunksRequest{Name: "pol", Workspace: ws})
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
		fp     = codes.FailedPrecondition
	)
	apitest.Matrix(t, calls, []apitest.Case{
		// Refused before any state changes: the chunk is intact for the
		// admin below.
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{denied, ok, ok, nf, nf, nf, nf, nf, nf}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{denied, nf, nf, nf, nf, nf, nf, nf, nf}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{denied, denied, denied, denied, denied, denied, denied, denied, denied}},
		{Name: "own sandbox", P: apitest.Sandbox(id), Want: []codes.Code{ok, ok, denied, denied, denied, denied, denied, denied, denied}},
		// Edit ok; approve with a wrong token and approve-all with it are
		// refused; undo of a pending chunk is refused; reject and clear.
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{denied, ok, ok, ok, fp, ok, fp, ok, ok}},
	})
}

// TestDraftUpdatesReachWatchers: every change of a sandbox's drafts is
// published to its watchers as a DraftPolicyUpdate with the draft
// version, the new chunks and the pending total; a submission that
// changes nothing publishes nothing.
func TestDraftUpdatesReachWatchers(t *testing.T) {
	svc, f, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	updates, cancel := f.Engine.Subscribe(id)
	defer cancel()
	next := func(what string) *openshellv1.DraftPolicyUpdate {
		t.Helper()
		for {
			select {
			case u := <-updates:
				if u.Draft != nil {
					return u.Draft
				}
			default:
				t.Fatalf("%s: no draft update published", what)
				return nil
			}
		}
	}
	none := func(what string) {
		t.Helper()
		for {
			select {
			case u := <-updates:
				if u.Draft != nil {
					t.Fatalf("%s published %v, want nothing", what, u.Draft)
				}
			default:
				return
			}
		}
	}
	r := submit(t, svc, id, denial("/usr/bin/curl", "a.example.com", 443, 1), denial("/usr/bin/curl", "b.example.com", 443, 1))
	if u := next("first submission"); u.GetNewChunks() != 2 || u.GetTotalPending() != 2 || u.GetDraftVersion() != 1 || u.GetSummary() != "2 proposal(s) accepted (2 new chunk(s)), 0 rejected" {
		t.Errorf("update after the first submission = %v", u)
	}
	submit(t, svc, id, denial("/usr/bin/curl", "a.example.com", 443, 4))
	if u := next("repeat"); u.GetNewChunks() != 0 || u.GetTotalPending() != 2 || u.GetDraftVersion() != 1 {
		t.Errorf("update after a repeated denial = %v, want no new chunk", u)
	}
	submit(t, svc, id, denial("", "a.example.com", 443, 1)) // no binary: no chunk
	none("a submission making no chunk")
	var token string
	for _, c := range drafts(t, svc, "pending") {
		if c.GetId() == r.GetAcceptedChunkIds()[0] {
			token = c.GetReviewToken()
		}
	}
	if _, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: r.GetAcceptedChunkIds()[0], ReviewToken: token}); err != nil {
		t.Fatal(err)
	}
	if u := next("approval"); u.GetTotalPending() != 1 || u.GetSummary() != "chunk "+r.GetAcceptedChunkIds()[0]+" approved (policy version 2)" {
		t.Errorf("update after the approval = %v", u)
	}
	if _, err := svc.ApproveDraftChunk(admin, &openshellv1.ApproveDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: r.GetAcceptedChunkIds()[0], ReviewToken: token}); err == nil {
		t.Fatal("approving twice succeeded")
	}
	none("a refused approval")
	if _, err := svc.RejectDraftChunk(admin, &openshellv1.RejectDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: r.GetAcceptedChunkIds()[1]}); err != nil {
		t.Fatal(err)
	}
	if u := next("rejection"); u.GetTotalPending() != 0 || !strings.HasSuffix(u.GetSummary(), " rejected") {
		t.Errorf("update after the rejection = %v", u)
	}
	if _, err := svc.UndoDraftChunk(admin, &openshellv1.UndoDraftChunkRequest{Name: "pol", Workspace: "team-a", ChunkId: r.GetAcceptedChunkIds()[0]}); err != nil {
		t.Fatal(err)
	}
	if u := next("undo"); u.GetTotalPending() != 1 {
		t.Errorf("update after the undo = %v", u)
	}
	if _, err := svc.ClearDraftChunks(admin, &openshellv1.ClearDraftChunksRequest{Name: "pol", Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	if u := next("clear"); u.GetTotalPending() != 0 || u.GetSummary() != "1 pending chunk(s) cleared" {
		t.Errorf("update after clear = %v", u)
	}
}
