package store

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// Object types stored in the object_type column.
const (
	TypeSandbox          = "sandbox"
	TypeProvider         = "provider"
	TypeSSHSession       = "ssh_session"
	TypeWorkspace        = "workspace"
	TypeWorkspaceMember  = "workspace_member"
	TypeSandboxPolicy    = "sandbox_policy"
	TypeSandboxSettings  = "sandbox_settings"
	TypeGatewaySettings  = "gateway_settings"
	TypeReconcilerLease  = "reconciler_lease"
	TypeServiceEndpoint  = "service_endpoint"
	TypeInferenceRoute   = "inference_route"
	TypeDraftPolicyChunk = "draft_policy_chunk"
	TypeProviderProfile  = "provider_profile"
	TypeProviderRefresh  = "provider_refresh"
)

// Paging limits for List and ListScoped.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Store is the whole persistence layer: objects, scoped records and
// leases over one database. Implementations are safe for concurrent use.
// Every method returns errors wrapping an errdefs kind when the cause is
// the caller's (NotFound, AlreadyExists, Conflict, InvalidArgument) and
// errdefs.ErrUnavailable when the database cannot be reached.
type Store interface {
	Objects
	Records
	Leases
	// Close releases the database. In-flight calls fail afterwards.
	Close() error
}

// Objects persists metadata-carrying objects with conditional writes.
// Consumers that only keep objects take this interface.
type Objects interface {
	// Create inserts msg (MustCreate). An empty metadata.id is filled with a
	// new UUID. metadata.resource_version is set to 1 and created_at_ms to
	// now when zero.
	Create(ctx context.Context, objType string, msg proto.Message) (WriteResult, error)
	// Update replaces msg when the stored resource_version equals
	// expectedRV (0 means msg's metadata.resource_version).
	Update(ctx context.Context, objType string, msg proto.Message, expectedRV uint64) (WriteResult, error)
	// UpdateCAS reads object id into msg, calls mutate(msg) and writes it
	// back conditioned on the version read, in a single attempt.
	// expectedRV 0 means "whatever version was read"; otherwise a different
	// stored version is a conflict before mutate is called. mutate may not
	// change id, name or workspace (InvalidArgument). On success msg holds
	// the written state.
	UpdateCAS(ctx context.Context, objType, id string, expectedRV uint64, msg proto.Message, mutate func(proto.Message) error) (WriteResult, error)
	// Get reads object id into msg.
	Get(ctx context.Context, objType, id string, msg proto.Message) error
	// GetByName reads the object named name in workspace into msg.
	GetByName(ctx context.Context, objType, workspace, name string, msg proto.Message) error
	// List returns objects in created_at_ms, name, id order.
	List(ctx context.Context, objType string, opts ListOptions) ([]Object, error)
	// Delete removes object id and, in the same transaction, every record
	// it owns (see ScopeOwner); it reports whether a row was removed.
	Delete(ctx context.Context, objType, id string) (bool, error)
	// DeleteIf removes object id when its resource_version equals
	// expectedRV, with the records it owns; a mismatch is a
	// *ConflictError, a missing row NotFound.
	DeleteIf(ctx context.Context, objType, id string, expectedRV uint64) error
	// DeleteByScope removes every object of objType in scope.
	DeleteByScope(ctx context.Context, objType, scope string) (int64, error)
}

// Records persists scoped, versioned records (policy revisions, settings,
// draft policy chunks).
type Records interface {
	// CreateScoped inserts rec at the next version within (Type, Scope)
	// and returns it with Version, ID (when empty) and timestamps set.
	// A record type with an owner (see ScopeOwner) needs the owner object
	// whose id is Scope: without it the insert is NotFound. The same holds
	// for RecordHit and CommitPolicyRevision.
	CreateScoped(ctx context.Context, rec Record) (Record, error)
	// GetScoped returns record id.
	GetScoped(ctx context.Context, objType, id string) (Record, error)
	// GetLatestScoped returns the highest version in scope, restricted to
	// status when status is not empty.
	GetLatestScoped(ctx context.Context, objType, scope, status string) (Record, error)
	// ListScoped returns records of scope by descending version.
	ListScoped(ctx context.Context, objType, scope string, limit, offset int) ([]Record, error)
	// UpdateScoped replaces Status and Payload of record rec.ID when its
	// resource_version equals expectedRV.
	UpdateScoped(ctx context.Context, rec Record, expectedRV uint64) (WriteResult, error)
	// SupersedeScoped sets status on records of scope with a version below
	// belowVersion whose status is one of from (any status but status
	// itself when from is empty). It returns the number changed.
	SupersedeScoped(ctx context.Context, objType, scope string, belowVersion int64, status string, from ...string) (int64, error)
	// RecordHit inserts rec keyed by (Type, Scope, DedupKey) or, when that
	// key exists, adds rec.HitCount (1 when 0) to its hit_count; nothing
	// else of the stored record changes. It returns the stored record and
	// whether it was created.
	RecordHit(ctx context.Context, rec Record) (Record, bool, error)
	// CommitPolicyRevision runs rev atomically; see PolicyRevision.
	CommitPolicyRevision(ctx context.Context, rev PolicyRevision) (PolicyRevisionResult, error)
}

// Leases persists named, expiring claims renewed by compare-and-swap.
type Leases interface {
	// AcquireLease takes lease name for holder for ttl when it is free,
	// expired or already held by holder. A lease held by someone else is a
	// *LeaseHeldError (errdefs.ErrFailedPrecondition).
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error)
	// RenewLease extends l by ttl if l is still the stored lease (CAS);
	// otherwise it returns a *ConflictError.
	RenewLease(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// ReleaseLease deletes l if it is still the stored lease.
	ReleaseLease(ctx context.Context, l Lease) error
}

// WriteResult is what a write assigned, returned without reading back.
type WriteResult struct {
	ResourceVersion uint64
	CreatedAtMs     int64
	UpdatedAtMs     int64
}

// ListOptions selects objects for List.
type ListOptions struct {
	Workspace     string // ignored when AllWorkspaces
	AllWorkspaces bool
	Limit         int // 0 = DefaultLimit; above MaxLimit is clamped
	Offset        int
	LabelSelector string // "k=v,k2=v2"; empty matches everything
}

// Object is one stored row of a metadata-carrying object.
type Object struct {
	ID              string
	Type            string
	Workspace       string
	Name            string
	Labels          map[string]string
	ResourceVersion uint64
	CreatedAtMs     int64
	UpdatedAtMs     int64
	Payload         []byte // the serialized message as stored
}

// Record is a scoped/versioned row (policy revisions, settings, draft
// chunks). Payload is opaque bytes, normally a serialized message.
type Record struct {
	ID              string
	Type            string
	Scope           string
	Version         int64
	Status          string
	DedupKey        string
	HitCount        int64
	Payload         []byte
	ResourceVersion uint64
	CreatedAtMs     int64
	UpdatedAtMs     int64
}

// PolicyRevision describes one atomic CommitPolicyRevision: in a single
// transaction holding the scope's write lock it
//
//  1. inserts Backfill at the next version when it is non-nil and the
//     scope has no records yet (e.g. the sandbox's creation-time policy),
//  2. inserts Revision at the next version,
//  3. when Project is non-nil, reads Project.ID into Project.Msg, calls
//     Project.Mutate and writes it back conditioned on Project.ExpectedRV
//     (0 = the version read under the lock),
//  4. when SupersedeStatus is set, marks older records (status in
//     SupersedeFrom, or any other status when empty) with SupersedeStatus.
//
// Any error, including one returned by Fault, rolls everything back.
type PolicyRevision struct {
	Revision        Record // Type and Scope required
	Backfill        *Record
	Project         *Projection
	SupersedeStatus string
	SupersedeFrom   []string
	// Fault, when set, is called after each step with its name
	// ("backfill", "revision", "project", "supersede"); a non-nil error
	// aborts the transaction. It exists for fault-injection tests. It runs
	// while the transaction holds its locks (and, for in-memory SQLite, the
	// only connection), so it must not call the store.
	Fault func(step string) error
}

// Projection is the CAS update of a metadata-carrying object performed by
// CommitPolicyRevision.
type Projection struct {
	Type       string
	ID         string
	ExpectedRV uint64
	Msg        proto.Message
	Mutate     func(proto.Message) error
}

// PolicyRevisionResult reports what CommitPolicyRevision wrote.
type PolicyRevisionResult struct {
	Revision   Record
	Backfilled *Record
	Projected  WriteResult
	Superseded int64
}

// Lease is a named, expiring claim held by one holder.
type Lease struct {
	Name            string
	Holder          string
	ExpiresAtMs     int64
	ResourceVersion uint64
}

// Expired reports whether the lease has expired at now.
func (l Lease) Expired(now time.Time) bool { return now.UnixMilli() >= l.ExpiresAtMs }

// ConflictError is a failed compare-and-swap. It wraps errdefs.ErrConflict
// (gRPC Aborted).
type ConflictError struct {
	Type     string
	ID       string
	Expected uint64
	Current  uint64 // meaningless when Gone
	Gone     bool   // the row no longer exists
}

func (e *ConflictError) Error() string {
	if e.Gone {
		return fmt.Sprintf("%s %q was modified concurrently: it no longer exists", e.Type, e.ID)
	}
	return fmt.Sprintf("%s %q was modified concurrently: resource version %d, expected %d", e.Type, e.ID, e.Current, e.Expected)
}

func (e *ConflictError) Unwrap() error { return errdefs.ErrConflict }

// LeaseHeldError reports a lease held by another holder. It wraps
// errdefs.ErrFailedPrecondition.
type LeaseHeldError struct {
	Lease Lease
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("lease %q is held by %q", e.Lease.Name, e.Lease.Holder)
}

func (e *LeaseHeldError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// ValidateType rejects an empty object type.
func ValidateType(objType string) error {
	if objType == "" {
		return errdefs.InvalidArgument("object type is required")
	}
	return nil
}

// Limit normalizes a requested page size.
func Limit(n int) int {
	switch {
	case n <= 0:
		return DefaultLimit
	case n > MaxLimit:
		return MaxLimit
	}
	return n
}
