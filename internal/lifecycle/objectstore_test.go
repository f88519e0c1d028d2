package lifecycle_test

import (
	"errors"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
)

func openSQLite(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func sandboxWithPolicy(id, name string) *openshellv1.Sandbox {
	return &openshellv1.Sandbox{
		Metadata: &datamodelv1.ObjectMeta{Id: id, Name: name, Workspace: "default"},
		Spec: &openshellv1.SandboxSpec{Policy: &sandboxv1.SandboxPolicy{
			Version:    1,
			Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr"}},
		}},
	}
}

// A sandbox created with spec.policy has that policy stored as revision 1,
// so the supervisor's ReportPolicyStatus for version 1 finds it; deleting
// the sandbox removes its revisions.
func TestObjectStoreStoresPolicyVersionOne(t *testing.T) {
	s := openSQLite(t)
	o := lifecycle.ObjectStore{S: s}
	sb := sandboxWithPolicy("2d3c0c4e-0000-4000-8000-000000000001", "pol")
	if err := o.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	rec, err := s.GetLatestScoped(t.Context(), policy.RecordType, sb.Metadata.Id, "")
	if err != nil {
		t.Fatalf("GetLatestScoped(policy) = %v, want version 1", err)
	}
	rev, err := policy.DecodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if rev.GetVersion() != 1 || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_PENDING ||
		rev.GetPolicyHash() != policy.Hash(sb.Spec.Policy) || !proto.Equal(rev.GetPolicy(), sb.Spec.Policy) {
		t.Errorf("stored revision = %v, want version 1 PENDING of spec.policy", rev)
	}
	if err := o.DeleteSandbox(t.Context(), sb.Metadata.Id, sb.Metadata.ResourceVersion); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLatestScoped(t.Context(), policy.RecordType, sb.Metadata.Id, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("policy revisions after delete: GetLatestScoped = %v, want NotFound", err)
	}
}

// When the policy cannot be stored the sandbox row is removed again:
// a create either stores both or neither.
func TestObjectStoreCreateIsAllOrNothing(t *testing.T) {
	s := openSQLite(t)
	o := lifecycle.ObjectStore{S: s}
	sb := sandboxWithPolicy("2d3c0c4e-0000-4000-8000-000000000002", "pol")
	// Occupy the revision's id (in another sandbox's scope: records need
	// their sandbox) so that its insert fails.
	if _, err := s.Create(t.Context(), store.TypeSandbox, &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Id: "other", Name: "other", Workspace: "default"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateScoped(t.Context(), store.Record{ID: policy.BaselineRecordID(sb.Metadata.Id), Type: policy.RecordType, Scope: "other"}); err != nil {
		t.Fatal(err)
	}
	err := o.CreateSandbox(t.Context(), sb)
	if err == nil || errors.Is(err, errdefs.ErrAlreadyExists) {
		// AlreadyExists would read as "sandbox already exists" to the caller.
		t.Fatalf("CreateSandbox with a failing policy write = %v, want an internal error", err)
	}
	if _, err := o.GetSandbox(t.Context(), sb.Metadata.Id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("sandbox row after a failed create: GetSandbox = %v, want NotFound", err)
	}
}

// The engine's row deletes are conditional (issue 13, defect 5): a delete
// at a version that is no longer current is Aborted and removes nothing,
// neither the row nor its policy revisions; at the current version both go.
func TestObjectStoreDeleteIsConditional(t *testing.T) {
	ctx := t.Context()
	s := openSQLite(t)
	o := lifecycle.ObjectStore{S: s}
	sb := sandboxWithPolicy("2d3c0c4e-0000-4000-8000-000000000003", "cond")
	if err := o.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	read := sb.GetMetadata().GetResourceVersion()
	sb.Status = &openshellv1.SandboxStatus{Phase: openshellv1.SandboxPhase_SANDBOX_PHASE_READY}
	if err := o.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := o.DeleteSandbox(ctx, sb.Metadata.Id, read); errdefs.Code(err) != codes.Aborted {
		t.Fatalf("DeleteSandbox at a stale version = %v, want Aborted", err)
	}
	if _, err := o.GetSandbox(ctx, sb.Metadata.Id); err != nil {
		t.Fatalf("row after the refused delete: %v", err)
	}
	if _, err := s.GetLatestScoped(ctx, policy.RecordType, sb.Metadata.Id, ""); err != nil {
		t.Fatalf("policy revision after the refused delete: %v", err)
	}
	if err := o.DeleteSandbox(ctx, sb.Metadata.Id, sb.Metadata.ResourceVersion); err != nil {
		t.Fatalf("DeleteSandbox at the current version: %v", err)
	}
	if _, err := s.GetLatestScoped(ctx, policy.RecordType, sb.Metadata.Id, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("policy revisions after delete: GetLatestScoped = %v, want NotFound", err)
	}
}
