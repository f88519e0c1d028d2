package policy_test

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
)

func newHistory(t *testing.T) (policy.History, store.Store) {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return policy.History{Store: s, Now: func() time.Time { return time.UnixMilli(1700000000000) }}, s
}

// createRow stores a sandbox row (without any revision) and returns it.
func createRow(t *testing.T, s store.Store, name string, p *sandboxv1.SandboxPolicy) *openshellv1.Sandbox {
	t.Helper()
	sb := &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Name: name, Workspace: "default"}, Spec: &openshellv1.SandboxSpec{Policy: p}}
	if _, err := s.Create(t.Context(), store.TypeSandbox, sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

func livePolicy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version:    1,
		Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}},
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}},
		},
	}
}

func versions(t *testing.T, h policy.History, id string) []uint32 {
	t.Helper()
	revs, err := h.List(t.Context(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var v []uint32
	for _, r := range revs {
		v = append(v, r.GetVersion())
	}
	return v
}

// A sandbox row without revisions (created before they were stored at
// create) gets spec.policy as version 1 exactly once, however many callers
// race for it.
func TestLatestBackfillsVersionOneOnce(t *testing.T) {
	h, s := newHistory(t)
	sb := createRow(t, s, "old", livePolicy())
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			rev, err := h.Latest(t.Context(), sb)
			if err == nil && (rev.GetVersion() != 1 || !proto.Equal(rev.GetPolicy(), sb.Spec.Policy)) {
				err = errors.New("not version 1 of spec.policy")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("Latest() = %v", err)
		}
	}
	if v := versions(t, h, sb.Metadata.Id); len(v) != 1 {
		t.Errorf("versions after racing backfills = %v, want [1]", v)
	}
	none := createRow(t, s, "none", nil)
	if _, err := h.Latest(t.Context(), none); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Latest(no policy) = %v, want NotFound", err)
	}
}

func TestUpdateOnALiveSandbox(t *testing.T) {
	h, s := newHistory(t)
	sb := createRow(t, s, "live", livePolicy())

	static := livePolicy()
	static.Filesystem.IncludeWorkdir = false
	_, err := h.Update(t.Context(), sb, static)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != "filesystem include_workdir cannot be changed on a live sandbox" {
		t.Fatalf("Update(include_workdir) = %v", err)
	}
	unsafe := livePolicy()
	unsafe.NetworkPolicies["gh"].Endpoints[0].Host = "*.com"
	if _, err := h.Update(t.Context(), sb, unsafe); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Update(TLD wildcard) = %v, want InvalidArgument", err)
	}
	// The refusals stored nothing.
	if v := versions(t, h, sb.Metadata.Id); len(v) != 0 {
		t.Fatalf("versions after refused updates = %v, want none", v)
	}

	more := livePolicy()
	more.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}
	rev, err := h.Update(t.Context(), sb, more)
	if err != nil || rev.GetVersion() != 2 || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_PENDING || rev.GetPolicyHash() != policy.Hash(more) {
		t.Fatalf("Update(network rule) = %v, %v; want version 2 PENDING", rev, err)
	}
	if again, err := h.Update(t.Context(), sb, more); err != nil || again.GetVersion() != 2 {
		t.Errorf("Update(same policy) = %v, %v; want version 2 again", again, err)
	}
	// Version 1 was PENDING when version 2 arrived: superseded.
	if v1, err := h.Get(t.Context(), sb.Metadata.Id, 1); err != nil || v1.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED {
		t.Errorf("Get(1) = %v, %v; want SUPERSEDED", v1, err)
	}
}

// Without spec.policy the first update is the baseline: it is written to
// spec.policy, and the static sections are fixed from then on.
func TestUpdateWithoutBaselineSetsIt(t *testing.T) {
	h, s := newHistory(t)
	sb := createRow(t, s, "bare", nil)
	rev, err := h.Update(t.Context(), sb, livePolicy())
	if err != nil || rev.GetVersion() != 1 {
		t.Fatalf("Update(first) = %v, %v; want version 1", rev, err)
	}
	row, err := store.GetAs(t.Context(), s, store.TypeSandbox, sb.Metadata.Id, func() *openshellv1.Sandbox { return &openshellv1.Sandbox{} })
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(row.GetSpec().GetPolicy(), livePolicy()) {
		t.Fatalf("spec.policy after the first update = %v, want it", row.GetSpec().GetPolicy())
	}
	changed := livePolicy()
	changed.Process = &sandboxv1.ProcessPolicy{RunAsUser: "1000"}
	if _, err := h.Update(t.Context(), row, changed); err == nil || err.Error() != "process policy cannot be changed on a live sandbox (applied at startup)" {
		t.Errorf("Update(process change after baseline) = %v", err)
	}
	// A stale copy of the row (no baseline) loses against the stored one.
	if _, err := h.Update(t.Context(), sb, changed); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Update(stale row without baseline) = %v, want Conflict", err)
	}
}

func TestReport(t *testing.T) {
	h, s := newHistory(t)
	sb := createRow(t, s, "rep", livePolicy())
	id := sb.Metadata.Id
	if _, err := h.Latest(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v      uint32
		status openshellv1.PolicyStatus
		want   string
	}{
		{0, openshellv1.PolicyStatus_POLICY_STATUS_LOADED, "version is required"},
		{1, openshellv1.PolicyStatus_POLICY_STATUS_PENDING, "status must be LOADED or FAILED"},
		{9, openshellv1.PolicyStatus_POLICY_STATUS_LOADED, "policy version 9 not found"},
	} {
		if err := h.Report(t.Context(), id, tc.v, tc.status, ""); err == nil || err.Error() != tc.want {
			t.Errorf("Report(%d, %v) = %v, want %q", tc.v, tc.status, err, tc.want)
		}
	}
	if err := h.Report(t.Context(), id, 1, openshellv1.PolicyStatus_POLICY_STATUS_FAILED, "network policies are not enforced"); err != nil {
		t.Fatal(err)
	}
	rev, err := h.Get(t.Context(), id, 1)
	if err != nil || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || rev.GetLoadError() != "network policies are not enforced" || rev.GetLoadedAtMs() != 0 {
		t.Fatalf("after FAILED: Get(1) = %v, %v", rev, err)
	}
	more := livePolicy()
	more.NetworkPolicies = nil
	if _, err := h.Update(t.Context(), sb, more); err != nil {
		t.Fatal(err)
	}
	if err := h.Report(t.Context(), id, 2, openshellv1.PolicyStatus_POLICY_STATUS_LOADED, "ignored"); err != nil {
		t.Fatal(err)
	}
	rev, err = h.Get(t.Context(), id, 0)
	if err != nil || rev.GetVersion() != 2 || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED || rev.GetLoadError() != "" || rev.GetLoadedAtMs() != 1700000000000 {
		t.Fatalf("after LOADED: Get(0) = %v, %v", rev, err)
	}
	// FAILED is not superseded: it stays the truth about version 1.
	if rev, err := h.Get(t.Context(), id, 1); err != nil || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED {
		t.Errorf("Get(1) after loading 2 = %v, %v; want FAILED kept", rev, err)
	}
}
