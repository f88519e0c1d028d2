package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// History reads and writes the policy revisions of sandboxes in a store.
// Version 1 is the sandbox's creation-time policy (spec.policy, its
// baseline); later versions come from UpdateConfig. It is safe for
// concurrent use: every write is a single store transaction or CAS.
type History struct {
	Store store.Store
	Now   func() time.Time // nil means time.Now
}

func (h History) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

var errNoRevision = errdefs.NotFound("no policy revision found for this sandbox")

// Latest returns sb's newest revision. A sandbox with spec.policy but no
// revision yet (created before revisions were stored at create) gets
// spec.policy stored as version 1 first. A sandbox without any policy is
// NotFound.
func (h History) Latest(ctx context.Context, sb *openshellv1.Sandbox) (*openshellv1.SandboxPolicyRevision, error) {
	id := sb.GetMetadata().GetId()
	rec, err := h.Store.GetLatestScoped(ctx, RecordType, id, "")
	if errors.Is(err, errdefs.ErrNotFound) && sb.GetSpec().GetPolicy() != nil {
		base, berr := BaselineRecord(id, sb.GetSpec().GetPolicy(), h.now())
		if berr != nil {
			return nil, berr
		}
		// AlreadyExists: someone else stored it first; read theirs.
		if _, berr := h.Store.CreateScoped(ctx, base); berr != nil && !errors.Is(berr, errdefs.ErrAlreadyExists) {
			return nil, fmt.Errorf("store policy version 1: %w", berr)
		}
		rec, err = h.Store.GetLatestScoped(ctx, RecordType, id, "")
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errNoRevision
	}
	if err != nil {
		return nil, err
	}
	return DecodeRecord(rec)
}

// Get returns version v of sandboxID's policy, the newest when v is 0.
func (h History) Get(ctx context.Context, sandboxID string, v uint32) (*openshellv1.SandboxPolicyRevision, error) {
	rec, err := h.find(ctx, sandboxID, v)
	if err != nil {
		return nil, err
	}
	return DecodeRecord(rec)
}

// List returns sandboxID's revisions, newest first.
func (h History) List(ctx context.Context, sandboxID string, limit, offset int) ([]*openshellv1.SandboxPolicyRevision, error) {
	return listRevisions(ctx, h.Store, RecordType, sandboxID, limit, offset)
}

// find returns the record of version v (0 = newest).
func (h History) find(ctx context.Context, sandboxID string, v uint32) (store.Record, error) {
	return findRevision(ctx, h.Store, RecordType, sandboxID, v, errNoRevision)
}

// listRevisions returns the revisions of typ in scope, newest first.
func listRevisions(ctx context.Context, recs store.Records, typ, scope string, limit, offset int) ([]*openshellv1.SandboxPolicyRevision, error) {
	rs, err := recs.ListScoped(ctx, typ, scope, limit, offset)
	if err != nil {
		return nil, err
	}
	out := make([]*openshellv1.SandboxPolicyRevision, 0, len(rs))
	for _, rec := range rs {
		rev, err := DecodeRecord(rec)
		if err != nil {
			return nil, err
		}
		out = append(out, rev)
	}
	return out, nil
}

// findRevision returns the record of version v (0 = newest) of typ in
// scope, notFound when there is none.
func findRevision(ctx context.Context, recs store.Records, typ, scope string, v uint32, notFound error) (store.Record, error) {
	if v == 0 {
		rec, err := recs.GetLatestScoped(ctx, typ, scope, "")
		if errors.Is(err, errdefs.ErrNotFound) {
			return store.Record{}, notFound
		}
		return rec, err
	}
	for offset := 0; ; offset += store.MaxLimit {
		rs, err := recs.ListScoped(ctx, typ, scope, store.MaxLimit, offset)
		if err != nil {
			return store.Record{}, err
		}
		for _, rec := range rs { // newest first
			if rec.Version == int64(v) {
				return rec, nil
			}
			if rec.Version < int64(v) {
				return store.Record{}, notFound
			}
		}
		if len(rs) < store.MaxLimit {
			return store.Record{}, notFound
		}
	}
}

// Update stores next as sb's new policy revision (PENDING) and returns it.
// next must pass ValidateUpdate against sb's baseline (spec.policy): on a
// live sandbox only the network sections may change. A policy equal to the
// newest revision is not stored again; that revision is returned. A
// sandbox without a baseline takes next as its baseline: it is written to
// spec.policy in the same transaction (the supervisor's first sync).
func (h History) Update(ctx context.Context, sb *openshellv1.Sandbox, next *sandboxv1.SandboxPolicy) (*openshellv1.SandboxPolicyRevision, error) {
	return h.Apply(ctx, sb, func(*sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) { return next, nil })
}

// applyAttempts bounds Apply's retries after concurrent writes.
const applyAttempts = 5

// errConcurrentPolicy is Apply's answer when every attempt lost a race.
var errConcurrentPolicy = errdefs.Conflict("sandbox policy was modified concurrently; please retry")

// Apply stores change(newest policy) as sb's new revision, as Update. The
// newest policy is nil when sb has none. The write is a compare-and-swap
// on the newest version: when another writer stored a revision since it
// was read, change runs again on that one (at most a few times, then
// Aborted), so no update is lost, across gateway replicas too.
func (h History) Apply(ctx context.Context, sb *openshellv1.Sandbox, change func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error)) (*openshellv1.SandboxPolicyRevision, error) {
	rev, _, err := h.ApplyWrite(ctx, sb, Write{}, change)
	return rev, err
}

// Write is what an UpdateConfig carries besides the policy change.
type Write struct {
	// Annotations are merged into the sandbox's metadata.annotations in
	// the same transaction as the revision, and kept as the revision's
	// provenance (OpenShell's UpdateConfig annotations).
	Annotations map[string]string
	// ExpectedRV, when not 0, is the sandbox's resource version the
	// caller read: the write is refused (Aborted) if it changed.
	ExpectedRV uint64
}

// ApplyWrite is Apply with w, and also returns the sandbox's annotations
// after the write. A change that leaves the policy and the provenance as
// they are stores no revision; the annotations are then still merged
// (compare-and-swap on w.ExpectedRV) unless they are all present already.
func (h History) ApplyWrite(ctx context.Context, sb *openshellv1.Sandbox, w Write, change func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error)) (*openshellv1.SandboxPolicyRevision, map[string]string, error) {
	for range applyAttempts {
		rev, ann, err := h.applyOnce(ctx, sb, w, change)
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			return rev, ann, err
		}
	}
	return nil, nil, errConcurrentPolicy
}

// hasAnnotations reports whether every annotation of want is in have.
func hasAnnotations(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// projectAnnotations merges w.Annotations into row (a *Sandbox).
func projectAnnotations(w Write) func(proto.Message) error {
	return func(m proto.Message) error {
		row := m.(*openshellv1.Sandbox)
		if len(w.Annotations) == 0 {
			return nil
		}
		if row.Metadata.Annotations == nil {
			row.Metadata.Annotations = map[string]string{}
		}
		maps.Copy(row.Metadata.Annotations, w.Annotations)
		return nil
	}
}

// Annotate merges w.Annotations into sb's metadata with a compare-and-swap
// on w.ExpectedRV (nothing is written when they are all present already)
// and returns the sandbox's annotations.
func (h History) Annotate(ctx context.Context, sb *openshellv1.Sandbox, w Write) (map[string]string, error) {
	if hasAnnotations(sb.GetMetadata().GetAnnotations(), w.Annotations) {
		return sb.GetMetadata().GetAnnotations(), nil
	}
	row := &openshellv1.Sandbox{}
	if _, err := h.Store.UpdateCAS(ctx, store.TypeSandbox, sb.GetMetadata().GetId(), w.ExpectedRV, row, projectAnnotations(w)); err != nil {
		return nil, err
	}
	return row.GetMetadata().GetAnnotations(), nil
}

func (h History) applyOnce(ctx context.Context, sb *openshellv1.Sandbox, w Write, change func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error)) (*openshellv1.SandboxPolicyRevision, map[string]string, error) {
	baseline := sb.GetSpec().GetPolicy()
	id := sb.GetMetadata().GetId()
	// The newest revision; a baseline not stored yet stands for version 1
	// (the commit stores it, so a refused change stores nothing).
	var latest *openshellv1.SandboxPolicyRevision
	rec, err := h.Store.GetLatestScoped(ctx, RecordType, id, "")
	switch {
	case err == nil:
		if latest, err = DecodeRecord(rec); err != nil {
			return nil, nil, err
		}
	case errors.Is(err, errdefs.ErrNotFound) && baseline != nil:
		latest = &openshellv1.SandboxPolicyRevision{Version: 1, Policy: baseline, PolicyHash: Hash(baseline)}
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, nil, err
	}
	next, err := change(latest.GetPolicy())
	if err != nil {
		return nil, nil, err
	}
	if err := ValidateUpdate(baseline, next); err != nil {
		return nil, nil, err
	}
	if latest != nil && latest.GetPolicyHash() == Hash(next) && maps.Equal(latest.GetProvenance(), w.Annotations) {
		rev, err := h.Latest(ctx, sb) // stores the baseline when it is not yet
		if err != nil {
			return nil, nil, err
		}
		ann, err := h.Annotate(ctx, sb, w)
		return rev, ann, err
	}
	now := h.now()
	rev := &openshellv1.SandboxPolicyRevision{
		PolicyHash: Hash(next), Status: openshellv1.PolicyStatus_POLICY_STATUS_PENDING,
		CreatedAtMs: now.UnixMilli(), Policy: next, Provenance: w.Annotations,
	}
	rec = store.Record{Type: RecordType, Scope: id, ID: RevisionRecordID(id, latest.GetVersion()+1)}
	if err := EncodeRecord(&rec, rev); err != nil {
		return nil, nil, err
	}
	commit := store.PolicyRevision{
		Revision:        rec,
		SupersedeStatus: openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED.String(),
		SupersedeFrom:   []string{openshellv1.PolicyStatus_POLICY_STATUS_PENDING.String()},
	}
	if baseline != nil {
		bf, err := BaselineRecord(id, baseline, now)
		if err != nil {
			return nil, nil, err
		}
		commit.Backfill = &bf
	}
	row := &openshellv1.Sandbox{}
	if baseline == nil || len(w.Annotations) > 0 || w.ExpectedRV != 0 {
		annotate := projectAnnotations(w)
		commit.Project = &store.Projection{
			Type: store.TypeSandbox, ID: id, Msg: row, ExpectedRV: w.ExpectedRV,
			Mutate: func(m proto.Message) error {
				row := m.(*openshellv1.Sandbox)
				if baseline == nil {
					if row.GetSpec().GetPolicy() != nil {
						return errdefs.Conflict(fmt.Sprintf("sandbox %q got its policy while this update was in flight; retry", sb.GetMetadata().GetName()))
					}
					if row.Spec == nil {
						row.Spec = &openshellv1.SandboxSpec{}
					}
					row.Spec.Policy = next
				}
				return annotate(m)
			},
		}
	}
	res, err := h.Store.CommitPolicyRevision(ctx, commit)
	if err != nil {
		return nil, nil, err
	}
	ann := sb.GetMetadata().GetAnnotations()
	if commit.Project != nil {
		ann = row.GetMetadata().GetAnnotations()
	}
	out, err := DecodeRecord(res.Revision)
	return out, ann, err
}

// Report records the status a supervisor reported for version v of
// sandboxID's policy: LOADED (older PENDING and LOADED revisions become
// SUPERSEDED) or FAILED with loadError.
func (h History) Report(ctx context.Context, sandboxID string, v uint32, status openshellv1.PolicyStatus, loadError string) error {
	if v == 0 {
		return errdefs.InvalidArgument("version is required")
	}
	loaded := status == openshellv1.PolicyStatus_POLICY_STATUS_LOADED
	if !loaded && status != openshellv1.PolicyStatus_POLICY_STATUS_FAILED {
		return errdefs.InvalidArgument("status must be LOADED or FAILED")
	}
	for attempt := 0; ; attempt++ {
		rec, err := h.find(ctx, sandboxID, v)
		if errors.Is(err, errNoRevision) {
			return errdefs.NotFound(fmt.Sprintf("policy version %d not found", v))
		}
		if err != nil {
			return err
		}
		rev, err := DecodeRecord(rec)
		if err != nil {
			return err
		}
		rev.Status, rev.LoadError, rev.LoadedAtMs = status, "", 0
		if loaded {
			rev.LoadedAtMs = h.now().UnixMilli()
		} else {
			rev.LoadError = loadError
		}
		if err := EncodeRecord(&rec, rev); err != nil {
			return err
		}
		_, err = h.Store.UpdateScoped(ctx, rec, rec.ResourceVersion)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 4 {
			continue // a concurrent supersede; read again
		}
		if err != nil {
			return err
		}
		break
	}
	if loaded {
		_, err := h.Store.SupersedeScoped(ctx, RecordType, sandboxID, int64(v), openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED.String(),
			openshellv1.PolicyStatus_POLICY_STATUS_PENDING.String(), openshellv1.PolicyStatus_POLICY_STATUS_LOADED.String())
		return err
	}
	return nil
}
