// Package store is the gateway's persistence layer: one logical table of
// objects (id, object_type, workspace, name, scope, version, status,
// dedup_key, hit_count, labels, resource_version, payload, timestamps) kept
// in SQLite (package store/sqlite) or PostgreSQL (package store/postgres),
// both built on the shared SQL core in store/sqlstore. store/open selects a
// backend from a URL:
//
//	s, err := open.Open(ctx, "sqlite:/var/lib/openshell/gateway.db", logger)
//
// Store is three small interfaces over that one database: Objects
// (metadata-carrying objects), Records (scoped, versioned records) and
// Leases. A consumer takes the one it needs (lifecycle.ObjectStore, for
// one, takes Objects and CreateScoped); the typed helpers GetAs, ListAs and
// UpdateCASAs work on any Objects.
//
// # Objects
//
// Resources are protobuf messages with a field named "metadata" of type
// openshell.datamodel.v1.ObjectMeta. The store reads id, name, workspace,
// labels and created_at_ms from it and stores the whole message (unknown
// fields included) as the payload. Reads hydrate metadata.resource_version
// from the resource_version column.
//
// Every write is conditional:
//
//   - Create is MustCreate: it inserts with resource_version 1; a duplicate
//     id or (type, workspace, name) is an errdefs.ErrAlreadyExists error
//     naming the object.
//   - Update is MatchResourceVersion: it bumps resource_version by one when
//     the stored version equals the expected one, else it returns a
//     *ConflictError (errdefs.ErrConflict, gRPC Aborted) carrying the current
//     version, or Gone when the row no longer exists.
//   - UpdateCAS is a single read-mutate-write attempt; callers loop on
//     errdefs.ErrConflict when they want retries.
//   - DeleteIf deletes only at the expected version.
//
// There is no unconditional write outside tests (see store/storetesting).
// Writes return the assigned version and timestamps in a WriteResult and
// also set metadata.resource_version (and created_at_ms when it was zero)
// on the message passed in.
//
// A missing object is an errdefs.ErrNotFound error, never a nil result.
// Bad input (empty type, bad selector, oversized labels) is
// errdefs.ErrInvalidArgument.
//
// # Lists and selectors
//
// List returns objects of one type in one workspace (or all workspaces)
// ordered by created_at_ms, then name, then id, paged by Limit (default
// 100, maximum 1000) and Offset. A label selector "k=v,k2=v2" keeps objects
// whose labels contain every pair; it is evaluated in SQL. ParseLabelSelector
// and ValidateLabels implement the Kubernetes label syntax and are reused
// by the API layer.
//
// # Scoped records
//
// Records without ObjectMeta (policy revisions, settings, draft chunks) use
// the Record API: CreateScoped assigns the next version within (type,
// scope); GetLatestScoped, ListScoped, SupersedeScoped and RecordHit
// (dedup_key / hit_count upsert) complete it. CommitPolicyRevision runs
// "create revision, optional backfill, project onto the sandbox row with
// CAS, supersede older revisions" in one transaction: any failure rolls all
// of it back.
//
// # Leases
//
// AcquireLease, RenewLease and ReleaseLease implement a holder+expiry lease
// stored as a reconciler_lease object and renewed by compare-and-swap.
//
// # Concurrency
//
// A Store is safe for concurrent use by many goroutines and, for
// PostgreSQL, by many gateway replicas sharing one database: the
// resource_version column is the only cross-writer boundary.
package store
