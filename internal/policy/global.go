package policy

import (
	"context"
	"errors"
	"math"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// GlobalRecordType is the store type of global policy revisions, all in
// scope GlobalScope. They belong to no object.
const GlobalRecordType = "global_policy"

// GlobalScope is the record scope of the global policy revisions.
const GlobalScope = "global"

// Global reads and writes the gateway-wide policy, which overrides every
// sandbox's own policy while it is set. Its revisions are versioned like
// a sandbox's; the one in force has status LOADED (the gateway serves it:
// whether a supervisor enforces it is that sandbox's policy status), older
// ones and a removed one are SUPERSEDED. It is safe for concurrent use:
// Set and Remove are single store transactions.
type Global struct {
	Store store.Records
	Now   func() time.Time // nil means time.Now
}

var errNoGlobal = errdefs.NotFound("no global policy revision found")

// Active returns the global policy revision in force; NotFound when no
// global policy is set.
func (g Global) Active(ctx context.Context) (*openshellv1.SandboxPolicyRevision, error) {
	rec, err := g.Store.GetLatestScoped(ctx, GlobalRecordType, GlobalScope, openshellv1.PolicyStatus_POLICY_STATUS_LOADED.String())
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.NotFound("no global policy is set")
	}
	if err != nil {
		return nil, err
	}
	return DecodeRecord(rec)
}

// Set validates p with Validate (the global policy has no baseline: it
// replaces each sandbox's whole policy) and stores it as the next global
// revision, in force at once; the previous ones become SUPERSEDED in the
// same transaction. A policy equal to the one in force is not stored
// again; that revision is returned.
func (g Global) Set(ctx context.Context, p *sandboxv1.SandboxPolicy) (*openshellv1.SandboxPolicyRevision, error) {
	if err := Validate(p); err != nil {
		return nil, err
	}
	hash := Hash(p)
	if cur, err := g.Active(ctx); err == nil && cur.GetPolicyHash() == hash {
		return cur, nil
	} else if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	now := time.Now()
	if g.Now != nil {
		now = g.Now()
	}
	rec, err := NewRecord(GlobalScope, p, now)
	if err != nil {
		return nil, err
	}
	rec.Type = GlobalRecordType
	rev, err := DecodeRecord(rec)
	if err != nil {
		return nil, err
	}
	rev.Status, rev.LoadedAtMs = openshellv1.PolicyStatus_POLICY_STATUS_LOADED, now.UnixMilli()
	if err := EncodeRecord(&rec, rev); err != nil {
		return nil, err
	}
	res, err := g.Store.CommitPolicyRevision(ctx, store.PolicyRevision{
		Revision:        rec,
		SupersedeStatus: openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED.String(),
	})
	if err != nil {
		return nil, err
	}
	return DecodeRecord(res.Revision)
}

// Remove ends the global policy: every revision becomes SUPERSEDED and
// sandboxes get their own policy again. It reports whether a global policy
// was in force.
func (g Global) Remove(ctx context.Context) (bool, error) {
	n, err := g.Store.SupersedeScoped(ctx, GlobalRecordType, GlobalScope, math.MaxInt64, openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED.String(),
		openshellv1.PolicyStatus_POLICY_STATUS_LOADED.String())
	return n > 0, err
}

// Get returns global revision v, the newest when v is 0.
func (g Global) Get(ctx context.Context, v uint32) (*openshellv1.SandboxPolicyRevision, error) {
	rec, err := findRevision(ctx, g.Store, GlobalRecordType, GlobalScope, v, errNoGlobal)
	if err != nil {
		return nil, err
	}
	return DecodeRecord(rec)
}

// List returns the global revisions, newest first.
func (g Global) List(ctx context.Context, limit, offset int) ([]*openshellv1.SandboxPolicyRevision, error) {
	return listRevisions(ctx, g.Store, GlobalRecordType, GlobalScope, limit, offset)
}
