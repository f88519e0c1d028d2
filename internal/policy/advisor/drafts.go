package advisor

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store"
)

// Chunk statuses.
const (
	StatusPending  = "pending"
	StatusApproved = "approved"
	StatusRejected = "rejected"
)

// ModeMechanistic is the analysis_mode of proposals mapped from observed
// denials; they are deduplicated by (host, port, binary).
const ModeMechanistic = "mechanistic"

// Bounds of the draft inbox.
const (
	// MaxChunks bounds the chunks of one sandbox; proposals past it are
	// rejected until chunks are cleared.
	MaxChunks = 500
	// MaxSubmission bounds summaries plus proposed chunks of one call.
	MaxSubmission = 256
	// maxHitsPerSubmission is OpenShell's clamp of one submission's count.
	maxHitsPerSubmission = 100
	// MaxRuleSize bounds the encoded size of one proposed rule.
	MaxRuleSize = 16 << 10
)

// Drafts keeps the policy advisor's draft chunks of sandboxes in a store
// (type draft_policy_chunk, scope = sandbox id, deleted with the sandbox)
// and turns approvals into policy revisions through policy.History, the
// one write path of sandbox policies. It is safe for concurrent use:
// every chunk write is a compare-and-swap on the chunk's resource version
// (a lost race is Aborted), every policy write a History.Apply.
type Drafts struct {
	Store   store.Store
	History policy.History
	Now     func() time.Time // nil means time.Now
}

// Sandbox is what the advisor needs to know of a sandbox at one moment.
type Sandbox struct {
	Sandbox *openshellv1.Sandbox
	// CredentialHosts are the hosts the sandbox holds credentials for
	// (its providers' endpoints); reach to them is reported by the prover.
	CredentialHosts []string
	// Global is set when a global policy is in force: approvals are then
	// refused, as the sandbox's own policy is not what it runs.
	Global bool
	// Auto is proposal_approval_mode "auto": proposals without prover
	// findings and security notes are approved on arrival.
	Auto bool
}

func (d Drafts) now() time.Time {
	if d.Now == nil {
		return time.Now()
	}
	return d.Now()
}

func (s Sandbox) id() string { return s.Sandbox.GetMetadata().GetId() }

// chunk is one stored draft chunk.
type chunk struct {
	rec store.Record
	p   *openshellv1.DraftChunkPayload
}

var (
	errChunkNotFound = errdefs.NotFound("chunk not found")
	errGlobal        = errdefs.FailedPrecondition("cannot approve rules while a global policy is active; delete the global policy to manage per-sandbox rules")
)

func decode(rec store.Record) (chunk, error) {
	p := &openshellv1.DraftChunkPayload{}
	if err := proto.Unmarshal(rec.Payload, p); err != nil {
		return chunk{}, fmt.Errorf("decode draft chunk %s: %w", rec.ID, err)
	}
	return chunk{rec: rec, p: p}, nil
}

// toProto is the wire form of c.
func (c chunk) toProto() *openshellv1.PolicyChunk {
	p := c.p
	return &openshellv1.PolicyChunk{
		Id: c.rec.ID, Status: c.rec.Status, RuleName: p.GetRuleName(), ProposedRule: p.GetProposedRule(),
		Rationale: p.GetRationale(), SecurityNotes: SecurityNotes(p.GetProposedRule()), Confidence: p.GetConfidence(),
		CreatedAtMs: c.rec.CreatedAtMs, DecidedAtMs: p.GetDecidedAtMs(), HitCount: int32(min(c.rec.HitCount, 1<<31-1)),
		FirstSeenMs: c.rec.CreatedAtMs, LastSeenMs: c.rec.UpdatedAtMs, Binary: p.GetBinary(),
		ValidationResult: p.GetValidationResult(), RejectionReason: p.GetRejectionReason(), ApplicationError: p.GetApplicationError(),
		ReviewToken: p.GetReviewToken(), CurrentEffectivePolicyHash: p.GetCurrentEffectivePolicyHash(),
		CandidateEffectivePolicyHash: p.GetCandidateEffectivePolicyHash(),
		CurrentEffectivePolicy:       p.GetCurrentEffectivePolicy(), CandidateEffectivePolicy: p.GetCandidateEffectivePolicy(),
	}
}

// list returns the chunks of a sandbox, oldest first.
func (d Drafts) list(ctx context.Context, sandboxID string) ([]chunk, error) {
	var out []chunk
	for offset := 0; ; offset += store.MaxLimit {
		recs, err := d.Store.ListScoped(ctx, store.TypeDraftPolicyChunk, sandboxID, store.MaxLimit, offset)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			c, err := decode(r)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		if len(recs) < store.MaxLimit {
			break
		}
	}
	slices.SortStableFunc(out, func(a, b chunk) int {
		return cmp.Or(cmp.Compare(a.rec.CreatedAtMs, b.rec.CreatedAtMs), cmp.Compare(a.rec.ID, b.rec.ID))
	})
	return out, nil
}

// get returns chunk id of sb; another sandbox's chunk reads NotFound.
func (d Drafts) get(ctx context.Context, sb Sandbox, id string) (chunk, error) {
	if id == "" {
		return chunk{}, errdefs.InvalidArgument("chunk_id is required")
	}
	rec, err := d.Store.GetScoped(ctx, store.TypeDraftPolicyChunk, id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && rec.Scope != sb.id()) {
		return chunk{}, errChunkNotFound
	}
	if err != nil {
		return chunk{}, err
	}
	return decode(rec)
}

// save writes c back (status and payload) if nobody changed it since it
// was read.
func (d Drafts) save(ctx context.Context, c *chunk) error {
	payload, err := proto.Marshal(c.p)
	if err != nil {
		return fmt.Errorf("encode draft chunk: %w", err)
	}
	c.rec.Payload = payload
	wr, err := d.Store.UpdateScoped(ctx, c.rec, c.rec.ResourceVersion)
	if errors.Is(err, errdefs.ErrConflict) {
		return errdefs.Conflict(fmt.Sprintf("draft chunk %s was modified concurrently; please retry", c.rec.ID))
	}
	if err != nil {
		return err
	}
	c.rec.ResourceVersion, c.rec.UpdatedAtMs = wr.ResourceVersion, wr.UpdatedAtMs
	return nil
}

// current is the sandbox's own newest policy (empty when it has none).
func (d Drafts) current(ctx context.Context, sb Sandbox) (*sandboxv1.SandboxPolicy, error) {
	rev, err := d.latest(ctx, sb)
	return rev.GetPolicy(), err
}

// latest is the sandbox's own newest revision (version 0 and an empty
// policy when it has none).
func (d Drafts) latest(ctx context.Context, sb Sandbox) (*openshellv1.SandboxPolicyRevision, error) {
	rev, err := d.History.Latest(ctx, sb.Sandbox)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &openshellv1.SandboxPolicyRevision{Policy: &sandboxv1.SandboxPolicy{}}, nil
	}
	return rev, err
}

// reconcile rejects the pending chunks of sb that revision rev already
// covers ("covered by active policy revision N", OpenShell's text): they
// would add nothing. A chunk changed meanwhile is left alone.
func (d Drafts) reconcile(ctx context.Context, sb Sandbox, rev *openshellv1.SandboxPolicyRevision) error {
	cs, err := d.list(ctx, sb.id())
	if err != nil {
		return err
	}
	for _, c := range cs {
		if c.rec.Status != StatusPending || !policy.Covers(rev.GetPolicy(), c.p.GetProposedRule()) {
			continue
		}
		err := d.decide(ctx, &c, StatusRejected, fmt.Sprintf("covered by active policy revision %d", rev.GetVersion()))
		if err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
	}
	return nil
}

// evaluate fills the policy-dependent fields of p (candidate, hashes,
// prover result, application error, review token) from the live policy
// cur. The review token binds a reviewer's approval to exactly these
// inputs.
func evaluate(p *openshellv1.DraftChunkPayload, cur *sandboxv1.SandboxPolicy, credHosts []string) {
	p.CurrentEffectivePolicy, p.CurrentEffectivePolicyHash = cur, policy.Hash(cur)
	p.CandidateEffectivePolicy, p.CandidateEffectivePolicyHash, p.ApplicationError = nil, "", ""
	cand, err := policy.AddRule(cur, p.GetRuleName(), p.GetProposedRule())
	switch {
	case err != nil:
		p.ApplicationError = "merge failed: " + oneLine(err.Error())
		p.ValidationResult = "merge failed: " + oneLine(err.Error())
	default:
		if err := policy.Validate(cand); err != nil {
			p.ApplicationError = "policy invalid: " + oneLine(err.Error())
			p.ValidationResult = p.ApplicationError
			break
		}
		p.CandidateEffectivePolicy, p.CandidateEffectivePolicyHash = cand, policy.Hash(cand)
		p.ValidationResult = ValidationResult(cur, cand, credHosts)
	}
	h := sha256.New()
	for _, s := range []string{p.GetCurrentEffectivePolicyHash(), p.GetRuleName(), policy.Hash(&sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"r": p.GetProposedRule()}}), strings.Join(credHosts, ",")} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	p.ReviewToken = hex.EncodeToString(h.Sum(nil))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// requireCurrent checks that c may be approved now with token: the token
// the reviewer saw (when given) is the stored one, the stored evaluation
// still holds for the live policy, and the proposal applies. Otherwise it
// stores the refreshed evaluation and answers FailedPrecondition
// (OpenShell's texts).
func (d Drafts) requireCurrent(ctx context.Context, sb Sandbox, c *chunk, token *string) error {
	if c.p.GetReviewToken() != "" && token != nil && *token != c.p.GetReviewToken() {
		return errdefs.FailedPrecondition("review token does not match the fetched proposal; refetch and review again")
	}
	cur, err := d.current(ctx, sb)
	if err != nil {
		return err
	}
	stored := c.p.GetReviewToken()
	evaluate(c.p, cur, sb.CredentialHosts)
	switch {
	case c.p.GetApplicationError() != "":
		if err := d.save(ctx, c); err != nil {
			return err
		}
		return errdefs.FailedPrecondition("proposal is not applicable: " + c.p.GetApplicationError())
	case stored != "" && stored != c.p.GetReviewToken():
		if err := d.save(ctx, c); err != nil {
			return err
		}
		return errdefs.FailedPrecondition("proposal inputs changed; evaluation refreshed, refetch and review again")
	}
	return nil
}

// AlwaysBlockedHost refuses a host the proxy would never dial: a
// loopback, link-local or unspecified address, localhost, or a cloud
// metadata hostname (OpenShell's texts, InvalidArgument). Unlike
// OpenShell, loopback entries of allowed_ips are not refused: this
// gateway's proxy does dial them when the endpoint names them.
func AlwaysBlockedHost(host string) error {
	host = strings.TrimSpace(host)
	lc := strings.ToLower(host)
	if a, err := parseAddr(host); err == nil && alwaysBlocked(a) {
		return errdefs.InvalidArgument(fmt.Sprintf("proposed rule endpoint host '%s' is an always-blocked address (loopback/link-local/unspecified); the proxy will deny traffic to this destination regardless of policy", host))
	}
	if lc == "localhost" || lc == "localhost." {
		return errdefs.InvalidArgument("proposed rule endpoint host 'localhost' is always blocked; the proxy will deny traffic to loopback regardless of policy")
	}
	if IsLinkLocalOrMetadata(lc) {
		return errdefs.InvalidArgument(fmt.Sprintf("proposed rule endpoint host '%s' is a known cloud metadata hostname; the proxy will deny traffic to this destination regardless of policy", host))
	}
	return nil
}

// AlwaysBlockedRule is AlwaysBlockedHost for every endpoint of rule.
// Submit and edit store such drafts; approval refuses them.
func AlwaysBlockedRule(rule *sandboxv1.NetworkPolicyRule) error {
	for _, ep := range rule.GetEndpoints() {
		if err := AlwaysBlockedHost(ep.GetHost()); err != nil {
			return err
		}
	}
	return nil
}

// merge adds c's rule to sb's policy as a new revision.
func (d Drafts) merge(ctx context.Context, sb Sandbox, c *chunk) (*openshellv1.SandboxPolicyRevision, error) {
	if err := AlwaysBlockedRule(c.p.GetProposedRule()); err != nil {
		return nil, d.keepError(ctx, c, err)
	}
	rev, err := d.History.Apply(ctx, sb.Sandbox, func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
		return policy.AddRule(cur, c.p.GetRuleName(), c.p.GetProposedRule())
	})
	if err != nil {
		return nil, d.keepError(ctx, c, err)
	}
	return rev, nil
}

// keepError records err as c's application error (the chunk stays as it
// is) and returns err.
func (d Drafts) keepError(ctx context.Context, c *chunk, err error) error {
	c.p.ApplicationError = oneLine(err.Error())
	if serr := d.save(ctx, c); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// decide sets c's status.
func (d Drafts) decide(ctx context.Context, c *chunk, status, reason string) error {
	c.rec.Status = status
	c.p.DecidedAtMs = d.now().UnixMilli()
	c.p.ApplicationError = ""
	if reason != "" {
		c.p.RejectionReason = reason
	}
	return d.save(ctx, c)
}

// Approve merges chunk id's rule into sb's policy (a new revision, which
// the running supervisor loads with its policy poll) and marks it
// approved. Only pending and rejected chunks can be approved, only while
// no global policy is in force, and only with the chunk's current review
// token (GetDraftPolicy).
func (d Drafts) Approve(ctx context.Context, sb Sandbox, id, token string) (*openshellv1.SandboxPolicyRevision, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("chunk_id is required")
	}
	if sb.Global {
		return nil, errGlobal
	}
	c, err := d.get(ctx, sb, id)
	if err != nil {
		return nil, err
	}
	if c.rec.Status != StatusPending && c.rec.Status != StatusRejected {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("chunk status is '%s', expected 'pending' or 'rejected'", c.rec.Status))
	}
	if err := d.requireCurrent(ctx, sb, &c, &token); err != nil {
		return nil, err
	}
	rev, err := d.merge(ctx, sb, &c)
	if err != nil {
		return nil, err
	}
	if err := d.decide(ctx, &c, StatusApproved, ""); err != nil {
		return nil, err
	}
	return rev, d.reconcile(ctx, sb, rev)
}

// Reject marks chunk id rejected with reason; an approved chunk's binary
// is first removed from its rule (a new revision).
func (d Drafts) Reject(ctx context.Context, sb Sandbox, id, reason string) error {
	c, err := d.get(ctx, sb, id)
	if err != nil {
		return err
	}
	if c.rec.Status != StatusPending && c.rec.Status != StatusApproved {
		return errdefs.FailedPrecondition(fmt.Sprintf("chunk status is '%s', expected 'pending' or 'approved'", c.rec.Status))
	}
	if c.rec.Status == StatusApproved {
		if sb.Global {
			return errGlobal
		}
		if _, err := d.unmerge(ctx, sb, c); err != nil {
			return err
		}
	}
	return d.decide(ctx, &c, StatusRejected, reason)
}

// unmerge removes c's binary from c's rule in sb's policy.
func (d Drafts) unmerge(ctx context.Context, sb Sandbox, c chunk) (*openshellv1.SandboxPolicyRevision, error) {
	return d.History.Apply(ctx, sb.Sandbox, func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
		return policy.RemoveBinary(cur, c.p.GetRuleName(), c.p.GetBinary())
	})
}

// Undo reverts an approved chunk: its binary leaves its rule (a new
// revision) and it is pending again, without its rejection reason.
func (d Drafts) Undo(ctx context.Context, sb Sandbox, id string) (*openshellv1.SandboxPolicyRevision, error) {
	c, err := d.get(ctx, sb, id)
	if err != nil {
		return nil, err
	}
	if c.rec.Status != StatusApproved {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("chunk status is '%s', expected 'approved'", c.rec.Status))
	}
	rev, err := d.unmerge(ctx, sb, c)
	if err != nil {
		return nil, err
	}
	c.rec.Status, c.p.DecidedAtMs, c.p.RejectionReason = StatusPending, 0, ""
	return rev, d.save(ctx, &c)
}

// Edit replaces a pending chunk's proposed rule and evaluates it afresh
// (new review token).
func (d Drafts) Edit(ctx context.Context, sb Sandbox, id string, rule *sandboxv1.NetworkPolicyRule) error {
	if id == "" {
		return errdefs.InvalidArgument("chunk_id is required")
	}
	if rule == nil {
		return errdefs.InvalidArgument("proposed_rule is required")
	}
	if proto.Size(rule) > MaxRuleSize {
		return errdefs.InvalidArgument(fmt.Sprintf("proposed_rule exceeds %d bytes", MaxRuleSize))
	}
	c, err := d.get(ctx, sb, id)
	if err != nil {
		return err
	}
	if c.rec.Status != StatusPending {
		return errdefs.FailedPrecondition(fmt.Sprintf("chunk status is '%s', expected 'pending'", c.rec.Status))
	}
	cur, err := d.current(ctx, sb)
	if err != nil {
		return err
	}
	c.p.ProposedRule = rule
	evaluate(c.p, cur, sb.CredentialHosts)
	return d.save(ctx, &c)
}

// Clear deletes sb's pending chunks and returns how many.
func (d Drafts) Clear(ctx context.Context, sb Sandbox) (uint32, error) {
	cs, err := d.list(ctx, sb.id())
	if err != nil {
		return 0, err
	}
	var n uint32
	for _, c := range cs {
		if c.rec.Status != StatusPending {
			continue
		}
		err := d.Store.DeleteIf(ctx, store.TypeDraftPolicyChunk, c.rec.ID, c.rec.ResourceVersion)
		switch {
		case err == nil:
			n++
		case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
			// decided or deleted meanwhile: no longer a pending chunk to clear
		default:
			return n, err
		}
	}
	return n, nil
}

// List returns sb's chunks (those of status when it is set), the draft
// version and when the newest chunk was proposed.
func (d Drafts) List(ctx context.Context, sb Sandbox, status string) ([]*openshellv1.PolicyChunk, uint64, int64, error) {
	cs, err := d.list(ctx, sb.id())
	if err != nil {
		return nil, 0, 0, err
	}
	var out []*openshellv1.PolicyChunk
	var version uint64
	var last int64
	for _, c := range cs {
		version = max(version, uint64(max(c.p.GetDraftVersion(), 0)))
		if status != "" && c.rec.Status != status {
			continue
		}
		out = append(out, c.toProto())
		last = max(last, c.rec.CreatedAtMs)
	}
	return out, version, last, nil
}

// Update describes sb's drafts after a change, for watchers
// (WatchSandbox's draft_policy_update): the draft version, the pending
// chunks, and newChunks and summary as given.
func (d Drafts) Update(ctx context.Context, sb Sandbox, newChunks uint32, summary string) (*openshellv1.DraftPolicyUpdate, error) {
	cs, err := d.list(ctx, sb.id())
	if err != nil {
		return nil, err
	}
	u := &openshellv1.DraftPolicyUpdate{NewChunks: newChunks, Summary: summary}
	for _, c := range cs {
		u.DraftVersion = max(u.DraftVersion, uint64(max(c.p.GetDraftVersion(), 0)))
		if c.rec.Status == StatusPending {
			u.TotalPending++
		}
	}
	return u, nil
}

// HistoryOf returns the proposal and decision events of sb's chunks,
// oldest first (OpenShell's texts).
func (d Drafts) HistoryOf(ctx context.Context, sb Sandbox) ([]*openshellv1.DraftHistoryEntry, error) {
	cs, err := d.list(ctx, sb.id())
	if err != nil {
		return nil, err
	}
	var out []*openshellv1.DraftHistoryEntry
	for _, c := range cs {
		out = append(out, &openshellv1.DraftHistoryEntry{
			TimestampMs: c.rec.CreatedAtMs, EventType: "proposed", ChunkId: c.rec.ID,
			Description: fmt.Sprintf("Rule '%s' proposed (confidence: %.0f%%)", c.p.GetRuleName(), c.p.GetConfidence()*100),
		})
		if t := c.p.GetDecidedAtMs(); t != 0 {
			out = append(out, &openshellv1.DraftHistoryEntry{
				TimestampMs: t, EventType: c.rec.Status, ChunkId: c.rec.ID,
				Description: fmt.Sprintf("Rule '%s' %s", c.p.GetRuleName(), c.rec.Status),
			})
		}
	}
	slices.SortStableFunc(out, func(a, b *openshellv1.DraftHistoryEntry) int { return cmp.Compare(a.TimestampMs, b.TimestampMs) })
	return out, nil
}

// dedupKey is OpenShell's observation key of mechanistic chunks.
func dedupKey(host string, port uint32, binary string) string {
	return fmt.Sprintf("%s|%d|%s", host, port, binary)
}

// ruleName is OpenShell's generated rule name for host:port.
func ruleName(host string, port uint32) string {
	var b strings.Builder
	for _, r := range strings.NewReplacer(".", "_", "-", "_").Replace(host) {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return fmt.Sprintf("allow_%s_%d", b.String(), port)
}

// wellKnownPorts name the ports OpenShell's mapper trusts more.
var wellKnownPorts = map[uint32]string{
	80: "HTTP", 443: "HTTPS", 8080: "HTTP-alt", 8443: "HTTPS-alt", 5432: "PostgreSQL", 3306: "MySQL", 6379: "Redis",
	27017: "MongoDB", 9200: "Elasticsearch", 9092: "Kafka", 2181: "ZooKeeper", 11211: "Memcached", 5672: "RabbitMQ",
	6443: "Kubernetes API", 53: "DNS", 587: "SMTP", 993: "IMAP", 995: "POP3",
}

// confidence is OpenShell's mapper score: 0.5, more for repeated denials
// and well-known ports, less for SSRF denials, within [0.1, 0.95].
func confidence(count, port uint32, ssrf bool) float32 {
	score := float32(0.5)
	switch {
	case count >= 10:
		score += 0.2
	case count >= 3:
		score += 0.1
	}
	if _, ok := wellKnownPorts[port]; ok {
		score += 0.15
	}
	if ssrf {
		score -= 0.2
	}
	return min(max(score, 0.1), 0.95)
}

// neverProposed are destinations the proxy refuses whatever the policy
// says and that carry no signal worth a reviewer's time: loopback,
// unspecified addresses and localhost. Link-local and metadata hosts are
// proposed (and flagged), unlike in OpenShell: a sandbox reaching for
// cloud metadata is worth seeing.
func neverProposed(host string) bool {
	if a, err := parseAddr(host); err == nil {
		a = a.Unmap()
		return a.IsLoopback() || a.IsUnspecified()
	}
	return host == "localhost" || host == "localhost."
}

// FromSummaries maps denial summaries to mechanistic chunks as OpenShell's
// sandbox-side mapper does: one L4 rule per (host, port, binary) allowing
// that binary to that endpoint (never with allowed_ips: a host resolving
// to an internal address stays behind the SSRF guard until a reviewer
// adds them), its count as hit_count, OpenShell's rationale and
// confidence. A summary without a binary, host or port, or for a
// loopback, unspecified or localhost destination, maps to nothing (a rule
// without binaries would allow every binary).
func FromSummaries(sums []*openshellv1.DenialSummary) []*openshellv1.PolicyChunk {
	var out []*openshellv1.PolicyChunk
	for _, s := range sums {
		host := strings.ToLower(strings.TrimSpace(s.GetHost()))
		if host == "" || s.GetPort() == 0 || s.GetBinary() == "" || neverProposed(host) {
			continue
		}
		name := ruleName(host, s.GetPort())
		portName := ""
		if n, ok := wellKnownPorts[s.GetPort()]; ok {
			portName = " (" + n + ")"
		}
		short := s.GetBinary()[strings.LastIndex(s.GetBinary(), "/")+1:]
		count := max(s.GetCount(), 1)
		out = append(out, &openshellv1.PolicyChunk{
			RuleName: name, Binary: s.GetBinary(), Stage: cmp.Or(s.GetDenialStage(), "connect"),
			Rationale:  fmt.Sprintf("Allow %s to connect to %s:%d%s.", short, host, s.GetPort(), portName),
			Confidence: confidence(count, s.GetPort(), s.GetDenialStage() == "ssrf"),
			HitCount:   int32(min(count, 1<<31-1)), FirstSeenMs: s.GetFirstSeenMs(), LastSeenMs: s.GetLastSeenMs(),
			ProposedRule: &sandboxv1.NetworkPolicyRule{
				Name:      name,
				Endpoints: []*sandboxv1.NetworkEndpoint{{Host: host, Port: s.GetPort()}},
				Binaries:  []*sandboxv1.NetworkBinary{{Path: s.GetBinary()}},
			},
		})
	}
	return out
}

// Submit stores the proposals of a SubmitPolicyAnalysis call as draft
// chunks of sb. Proposed chunks are taken as sent; without any, the
// denial summaries are mapped with FromSummaries (mechanistic). A
// mechanistic proposal for a (host, port, binary) that already has a
// chunk adds its count to that chunk's hit_count instead of creating one.
// Other pending chunks for the same (host, port, binary) are rejected as
// superseded; a fresh mechanistic chunk already covered by another
// approved chunk is rejected at once. With sb.Auto, a new pending chunk
// without prover findings, security notes or application error is
// approved at once.
func (d Drafts) Submit(ctx context.Context, sb Sandbox, req *openshellv1.SubmitPolicyAnalysisRequest) (*openshellv1.SubmitPolicyAnalysisResponse, uint32, error) {
	if n := len(req.GetSummaries()) + len(req.GetProposedChunks()); n > MaxSubmission {
		return nil, 0, errdefs.InvalidArgument(fmt.Sprintf("too many summaries and proposed chunks (%d > %d)", n, MaxSubmission))
	}
	proposals, mode := req.GetProposedChunks(), req.GetAnalysisMode()
	if len(proposals) == 0 {
		proposals, mode = FromSummaries(req.GetSummaries()), ModeMechanistic
	}
	resp := &openshellv1.SubmitPolicyAnalysisResponse{}
	if len(proposals) == 0 {
		return resp, 0, nil
	}
	existing, err := d.list(ctx, sb.id())
	if err != nil {
		return nil, 0, err
	}
	var draftVersion int64
	for _, c := range existing {
		draftVersion = max(draftVersion, c.p.GetDraftVersion())
	}
	draftVersion++
	latest, err := d.latest(ctx, sb)
	if err != nil {
		return nil, 0, err
	}
	if err := d.reconcile(ctx, sb, latest); err != nil {
		return nil, 0, err
	}
	cur := latest.GetPolicy()
	count := len(existing)
	var created uint32
	reject := func(reason string) {
		resp.RejectedChunks++
		resp.RejectionReasons = append(resp.RejectionReasons, reason)
	}
	for _, pc := range proposals {
		rule := pc.GetProposedRule()
		switch {
		case pc.GetRuleName() == "":
			reject("chunk missing rule_name")
			continue
		case strings.HasPrefix(pc.GetRuleName(), "_provider_"):
			reject(fmt.Sprintf("chunk '%s' uses reserved '_provider_' rule-name prefix", pc.GetRuleName()))
			continue
		case rule == nil:
			reject(fmt.Sprintf("chunk '%s' missing proposed_rule", pc.GetRuleName()))
			continue
		case proto.Size(rule) > MaxRuleSize:
			reject(fmt.Sprintf("chunk '%s': proposed_rule exceeds %d bytes", pc.GetRuleName(), MaxRuleSize))
			continue
		case count >= MaxChunks:
			reject(fmt.Sprintf("chunk '%s': the draft inbox holds %d chunks; clear or decide some first", pc.GetRuleName(), MaxChunks))
			continue
		}
		id, isNew, err := d.submitOne(ctx, sb, cur, pc, mode, draftVersion)
		if err != nil {
			if errors.Is(err, errdefs.ErrInvalidArgument) {
				reject(fmt.Sprintf("chunk '%s': %v", pc.GetRuleName(), err))
				continue
			}
			return nil, created, err
		}
		if isNew {
			created++
		}
		count++
		resp.AcceptedChunks++
		resp.AcceptedChunkIds = append(resp.AcceptedChunkIds, id)
	}
	return resp, created, nil
}

// submitOne stores one proposal and returns the id of the chunk that
// holds it and whether the chunk is new.
func (d Drafts) submitOne(ctx context.Context, sb Sandbox, cur *sandboxv1.SandboxPolicy, pc *openshellv1.PolicyChunk, mode string, draftVersion int64) (string, bool, error) {
	rule := proto.Clone(pc.GetProposedRule()).(*sandboxv1.NetworkPolicyRule)
	var host, binary string
	var port uint32
	if eps := rule.GetEndpoints(); len(eps) > 0 {
		host, port = strings.ToLower(eps[0].GetHost()), eps[0].GetPort()
	}
	if bs := rule.GetBinaries(); len(bs) > 0 {
		binary = bs[0].GetPath()
	}
	p := &openshellv1.DraftChunkPayload{
		RuleName: pc.GetRuleName(), ProposedRule: rule, Rationale: pc.GetRationale(),
		Confidence: min(max(pc.GetConfidence(), 0), 1), Host: host, Port: int32(min(port, 1<<31-1)), Binary: binary, DraftVersion: draftVersion,
	}
	evaluate(p, cur, sb.CredentialHosts)
	if mode != ModeMechanistic && p.GetApplicationError() != "" {
		return "", false, errdefs.InvalidArgument(p.GetApplicationError())
	}
	p.SecurityNotes = SecurityNotes(rule)
	payload, err := proto.Marshal(p)
	if err != nil {
		return "", false, fmt.Errorf("encode draft chunk: %w", err)
	}
	rec := store.Record{
		ID: uuid.NewString(), Type: store.TypeDraftPolicyChunk, Scope: sb.id(), Status: StatusPending,
		HitCount: int64(min(max(pc.GetHitCount(), 1), maxHitsPerSubmission)), Payload: payload,
	}
	rec.DedupKey = rec.ID // every agent-authored proposal is its own chunk
	if mode == ModeMechanistic {
		rec.DedupKey = dedupKey(host, port, binary)
	}
	stored, created, err := d.Store.RecordHit(ctx, rec)
	if err != nil {
		return "", false, err
	}
	if !created {
		return stored.ID, false, nil
	}
	others, err := d.list(ctx, sb.id())
	if err != nil {
		return "", true, err
	}
	for _, o := range others {
		if o.rec.ID == stored.ID || o.p.GetHost() != host || o.p.GetPort() != p.GetPort() || o.p.GetBinary() != binary {
			continue
		}
		switch {
		case o.rec.Status == StatusPending:
			if err := d.decide(ctx, &o, StatusRejected, "superseded by chunk "+stored.ID); err != nil && !errors.Is(err, errdefs.ErrConflict) {
				return "", true, err
			}
		case o.rec.Status == StatusApproved && mode == ModeMechanistic:
			c, err := decode(stored)
			if err != nil {
				return "", true, err
			}
			return stored.ID, true, d.decide(ctx, &c, StatusRejected, "already covered by approved chunk "+o.rec.ID)
		}
	}
	if sb.Auto {
		d.autoApprove(ctx, sb, stored)
	}
	return stored.ID, true, nil
}

// autoApprove approves a fresh chunk when nothing speaks against it: no
// global policy, no prover finding, no security note, no application
// error. A failure leaves it pending with the error recorded.
func (d Drafts) autoApprove(ctx context.Context, sb Sandbox, rec store.Record) {
	c, err := decode(rec)
	if err != nil || sb.Global || c.p.GetValidationResult() != NoNewFindings || SecurityNotes(c.p.GetProposedRule()) != "" || c.p.GetApplicationError() != "" {
		return
	}
	if _, err := d.merge(ctx, sb, &c); err != nil {
		return // recorded as the chunk's application error
	}
	_ = d.decide(ctx, &c, StatusApproved, "")
}

// ApproveAll approves sb's pending chunks (those named in approvals, each
// bound to its review token, or all) in one policy revision. Chunks with
// security notes are skipped unless includeFlagged, and so are chunks
// whose token is stale or missing, or that no longer apply; a change of
// the policy during the review is FailedPrecondition. It returns the
// revision (nil when nothing was approved) and the approved and skipped
// counts.
func (d Drafts) ApproveAll(ctx context.Context, sb Sandbox, includeFlagged bool, approvals []*openshellv1.DraftChunkApproval) (*openshellv1.SandboxPolicyRevision, uint32, uint32, error) {
	if sb.Global {
		return nil, 0, 0, errGlobal
	}
	all, err := d.list(ctx, sb.id())
	if err != nil {
		return nil, 0, 0, err
	}
	pending := map[string]chunk{}
	var order []string
	for _, c := range all {
		if c.rec.Status == StatusPending {
			pending[c.rec.ID] = c
			order = append(order, c.rec.ID)
		}
	}
	if len(pending) == 0 {
		return nil, 0, 0, errdefs.FailedPrecondition("no pending chunks to approve")
	}
	tokens := map[string]string{}
	if len(approvals) > 0 {
		order = order[:0]
		for _, a := range approvals {
			if _, ok := pending[a.GetChunkId()]; !ok {
				return nil, 0, 0, errdefs.FailedPrecondition(fmt.Sprintf("chunk '%s' is not pending; refetch before bulk approval", a.GetChunkId()))
			}
			tokens[a.GetChunkId()] = a.GetReviewToken()
			order = append(order, a.GetChunkId())
		}
	}
	cur, err := d.current(ctx, sb)
	if err != nil {
		return nil, 0, 0, err
	}
	reviewed := policy.Hash(cur)
	staged := cur
	var skipped uint32
	var accepted []chunk
	for _, id := range order {
		c := pending[id]
		if !includeFlagged && SecurityNotes(c.p.GetProposedRule()) != "" {
			skipped++
			continue
		}
		token := tokens[id]
		if err := d.requireCurrent(ctx, sb, &c, &token); err != nil {
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				skipped++
				continue
			}
			return nil, 0, 0, err
		}
		if err := AlwaysBlockedRule(c.p.GetProposedRule()); err != nil {
			_ = d.keepError(ctx, &c, err)
			skipped++
			continue
		}
		next, err := policy.AddRule(staged, c.p.GetRuleName(), c.p.GetProposedRule())
		if err == nil {
			err = policy.Validate(next)
		}
		if err != nil {
			_ = d.keepError(ctx, &c, err)
			skipped++
			continue
		}
		staged = next
		accepted = append(accepted, c)
	}
	if len(accepted) == 0 {
		return nil, 0, skipped, nil
	}
	rev, err := d.History.Apply(ctx, sb.Sandbox, func(live *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
		if live == nil {
			live = &sandboxv1.SandboxPolicy{}
		}
		if policy.Hash(live) != reviewed {
			return nil, errdefs.FailedPrecondition("proposal inputs changed during bulk review; refetch and review again")
		}
		return staged, nil
	})
	if err != nil {
		return nil, 0, skipped, err
	}
	for i := range accepted {
		if err := d.decide(ctx, &accepted[i], StatusApproved, ""); err != nil {
			return rev, uint32(i), skipped, err
		}
	}
	return rev, uint32(len(accepted)), skipped, d.reconcile(ctx, sb, rev)
}
