package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
)

// RecordType is the store type of policy revisions; a revision's scope is
// its sandbox's id and its version is the policy version.
const RecordType = store.TypeSandboxPolicy

// Hash is the policy hash reported with a revision: the SHA-256 of the
// deterministic encoding, hex.
func Hash(p *sandboxv1.SandboxPolicy) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// NewRecord returns the store record of a new PENDING revision of p for
// sandbox sandboxID. The store assigns the version.
func NewRecord(sandboxID string, p *sandboxv1.SandboxPolicy, now time.Time) (store.Record, error) {
	rev := &openshellv1.SandboxPolicyRevision{
		PolicyHash:  Hash(p),
		Status:      openshellv1.PolicyStatus_POLICY_STATUS_PENDING,
		CreatedAtMs: now.UnixMilli(),
		Policy:      p,
	}
	payload, err := proto.Marshal(rev)
	if err != nil {
		return store.Record{}, fmt.Errorf("encode policy revision: %w", err)
	}
	return store.Record{Type: RecordType, Scope: sandboxID, Status: rev.Status.String(), Payload: payload}, nil
}

// BaselineRecord is NewRecord for the sandbox's creation-time policy
// (spec.policy), which is always version 1. Its id is derived from the
// sandbox id, so every path that stores it (create, a lazy backfill, an
// update's backfill) writes the same row and a second attempt fails with
// AlreadyExists instead of adding a duplicate version.
func BaselineRecord(sandboxID string, p *sandboxv1.SandboxPolicy, now time.Time) (store.Record, error) {
	rec, err := NewRecord(sandboxID, p, now)
	rec.ID = BaselineRecordID(sandboxID)
	return rec, err
}

// baselineNamespace scopes the derived ids of baseline revisions.
var baselineNamespace = uuid.MustParse("6f0e4a52-0d0b-4c55-9d0a-3b1f6b0c9a11")

// BaselineRecordID is the id of sandboxID's version-1 revision.
func BaselineRecordID(sandboxID string) string { return RevisionRecordID(sandboxID, 1) }

// RevisionRecordID is the id of version v of sandboxID's policy. Every
// writer names the row after the version it expects to write (the newest
// it read plus one), so of two writers that read the same newest version
// the second fails on the primary key instead of stacking a revision on
// a policy it never saw (see History.Apply).
func RevisionRecordID(sandboxID string, v uint32) string {
	return uuid.NewSHA1(baselineNamespace, []byte(fmt.Sprintf("sandbox-policy/%s/%d", sandboxID, v))).String()
}

// DecodeRecord decodes a stored revision. Version and status come from the
// record's columns, which are authoritative (a supersede changes only the
// column).
func DecodeRecord(rec store.Record) (*openshellv1.SandboxPolicyRevision, error) {
	rev := &openshellv1.SandboxPolicyRevision{}
	if err := proto.Unmarshal(rec.Payload, rev); err != nil {
		return nil, fmt.Errorf("decode policy revision %s@%d: %w", rec.Scope, rec.Version, err)
	}
	rev.Version = uint32(rec.Version)
	if st, ok := openshellv1.PolicyStatus_value[rec.Status]; ok {
		rev.Status = openshellv1.PolicyStatus(st)
	}
	return rev, nil
}

// EncodeRecord writes rev back into rec's payload and status.
func EncodeRecord(rec *store.Record, rev *openshellv1.SandboxPolicyRevision) error {
	payload, err := proto.Marshal(rev)
	if err != nil {
		return fmt.Errorf("encode policy revision: %w", err)
	}
	rec.Payload, rec.Status = payload, rev.GetStatus().String()
	return nil
}
