// Package storetest is the conformance suite every store.Store backend
// runs: storetest.Run(t, newStore).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// NewStore returns a fresh, empty store; it registers its own cleanup.
type NewStore func(t testing.TB) store.Store

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"CreateGet", testCreateGet},
		{"CreateConflicts", testCreateConflicts},
		{"UpdateConditions", testUpdateConditions},
		{"UpdateCAS", testUpdateCAS},
		{"Delete", testDelete},
		{"BadInput", testBadInput},
		{"ListPagingOrder", testListPaging},
		{"ListSelectors", testListSelectors},
		{"UnknownFieldsPreserved", testUnknownFields},
		{"ScopedVersions", testScoped},
		{"RecordHit", testRecordHit},
		{"PolicyRevisionCommit", testPolicyRevision},
		{"PolicyRevisionRollback", testPolicyRevisionRollback},
		{"Lease", testLease},
		{"ConcurrentIncrements", testConcurrentIncrements},
		{"ConcurrentScopedVersions", testConcurrentScoped},
		{"OwnedRecordsGoWithTheirOwner", testOwnedRecords},
		{"OwnedRecordsConcurrentDelete", testOwnedRecordsConcurrentDelete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore(t)) })
	}
}

// Sandbox builds a test sandbox.
func Sandbox(id, workspace, name string, labels map[string]string) *openshellv1.Sandbox {
	return &openshellv1.Sandbox{
		Metadata: &datamodelv1.ObjectMeta{Id: id, Name: name, Workspace: workspace, Labels: labels},
		Spec:     &openshellv1.SandboxSpec{LogLevel: "info", Command: []string{"sleep", "1"}},
		Status:   &openshellv1.SandboxStatus{SandboxName: name},
	}
}

func newSandbox() *openshellv1.Sandbox { return &openshellv1.Sandbox{} }

// createSandboxes creates one sandbox per id (named after it) in "default":
// the owners that sandbox-scoped records need.
func createSandboxes(t testing.TB, s store.Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := s.Create(t.Context(), store.TypeSandbox, Sandbox(id, "default", id, nil)); err != nil {
			t.Fatalf("Create(sandbox %q): %v", id, err)
		}
	}
}

// WantCode fails t unless err maps to code through errdefs.ToGRPC.
func WantCode(t testing.TB, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(errdefs.ToGRPC(err)); got != code {
		t.Fatalf("error %v maps to %v, want %v", err, got, code)
	}
}

func testCreateGet(t *testing.T, s store.Store) {
	ctx := t.Context()
	sb := Sandbox("sb-1", "default", "foo", map[string]string{"team": "a"})
	wr, err := s.Create(ctx, store.TypeSandbox, sb)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if wr.ResourceVersion != 1 || wr.CreatedAtMs == 0 || wr.UpdatedAtMs == 0 {
		t.Fatalf("Create = %+v, want version 1 and timestamps", wr)
	}
	if sb.GetMetadata().GetResourceVersion() != 1 || sb.GetMetadata().GetCreatedAtMs() != wr.CreatedAtMs {
		t.Fatalf("Create left metadata %v, want rv 1 created %d", sb.GetMetadata(), wr.CreatedAtMs)
	}
	got := newSandbox()
	if err := s.Get(ctx, store.TypeSandbox, "sb-1", got); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if diff := cmp.Diff(sb, got, protocmp.Transform()); diff != "" {
		t.Fatalf("Get (-want +got):\n%s", diff)
	}
	byName := newSandbox()
	if err := s.GetByName(ctx, store.TypeSandbox, "default", "foo", byName); err != nil {
		t.Fatalf("GetByName: %v", err)
	}
	if diff := cmp.Diff(sb, byName, protocmp.Transform()); diff != "" {
		t.Fatalf("GetByName (-want +got):\n%s", diff)
	}
	err = s.Get(ctx, store.TypeSandbox, "missing", newSandbox())
	WantCode(t, err, codes.NotFound)
	if !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("NotFound error %q does not name the object", err)
	}
	WantCode(t, s.GetByName(ctx, store.TypeSandbox, "other", "foo", newSandbox()), codes.NotFound)
	// The id is per object, not per type: the same id as provider is not a sandbox.
	WantCode(t, s.Get(ctx, store.TypeProvider, "sb-1", &datamodelv1.Provider{}), codes.NotFound)

	// An empty id gets a generated one.
	anon := Sandbox("", "default", "anon", nil)
	if _, err := s.Create(ctx, store.TypeSandbox, anon); err != nil {
		t.Fatalf("Create without id: %v", err)
	}
	if anon.GetMetadata().GetId() == "" {
		t.Fatal("Create did not assign an id")
	}
}

func testCreateConflicts(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("sb-1", "default", "foo", nil)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		msg     *openshellv1.Sandbox
		wantMsg string
	}{
		{"same name", Sandbox("sb-2", "default", "foo", nil), `sandbox "foo" already exists in workspace "default"`},
		{"same id", Sandbox("sb-1", "default", "bar", nil), `sandbox with id "sb-1" already exists`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Create(ctx, store.TypeSandbox, tt.msg)
			WantCode(t, err, codes.AlreadyExists)
			if got := status.Convert(errdefs.ToGRPC(err)).Message(); got != tt.wantMsg {
				t.Fatalf("Create error = %q, want %q", got, tt.wantMsg)
			}
		})
	}
	// Same name in another workspace, or as another type, is fine.
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("sb-3", "other", "foo", nil)); err != nil {
		t.Fatalf("same name, other workspace: %v", err)
	}
	p := &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Id: "p-1", Name: "foo", Workspace: "default"}, Type: "claude"}
	if _, err := s.Create(ctx, store.TypeProvider, p); err != nil {
		t.Fatalf("same name, other type: %v", err)
	}
}

func testUpdateConditions(t *testing.T, s store.Store) {
	ctx := t.Context()
	sb := Sandbox("sb-1", "default", "foo", nil)
	if _, err := s.Create(ctx, store.TypeSandbox, sb); err != nil {
		t.Fatal(err)
	}
	sb.Spec.LogLevel = "debug"
	wr, err := s.Update(ctx, store.TypeSandbox, sb, 1)
	if err != nil {
		t.Fatalf("Update at rv 1: %v", err)
	}
	if wr.ResourceVersion != 2 || sb.GetMetadata().GetResourceVersion() != 2 {
		t.Fatalf("Update = %+v (msg rv %d), want rv 2", wr, sb.GetMetadata().GetResourceVersion())
	}
	// A stale write loses and learns the current version.
	stale := proto.Clone(sb).(*openshellv1.Sandbox)
	stale.Spec.LogLevel = "warn"
	_, err = s.Update(ctx, store.TypeSandbox, stale, 1)
	WantCode(t, err, codes.Aborted)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Current != 2 || ce.Expected != 1 || ce.Gone {
		t.Fatalf("stale Update error = %#v, want ConflictError current 2 expected 1", err)
	}
	got := newSandbox()
	if err := s.Get(ctx, store.TypeSandbox, "sb-1", got); err != nil {
		t.Fatal(err)
	}
	if got.GetSpec().GetLogLevel() != "debug" || got.GetMetadata().GetResourceVersion() != 2 {
		t.Fatalf("after stale write: %v, want debug at rv 2", got)
	}
	// expectedRV 0 uses the message's own version.
	got.Spec.LogLevel = "error"
	if wr, err := s.Update(ctx, store.TypeSandbox, got, 0); err != nil || wr.ResourceVersion != 3 {
		t.Fatalf("Update(rv from message) = %+v, %v; want rv 3", wr, err)
	}
	// A vanished row is a conflict that says so.
	gone := Sandbox("nope", "default", "nope", nil)
	_, err = s.Update(ctx, store.TypeSandbox, gone, 4)
	WantCode(t, err, codes.Aborted)
	if !errors.As(err, &ce) || !ce.Gone {
		t.Fatalf("Update of missing row = %v, want Gone conflict", err)
	}
	// Without any version an update is refused.
	WantCode(t, func() error {
		_, err := s.Update(ctx, store.TypeSandbox, Sandbox("sb-1", "default", "foo", nil), 0)
		return err
	}(), codes.InvalidArgument)
	// Renaming onto an existing name is AlreadyExists and changes nothing.
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("sb-2", "default", "bar", nil)); err != nil {
		t.Fatal(err)
	}
	ren := newSandbox()
	if err := s.Get(ctx, store.TypeSandbox, "sb-2", ren); err != nil {
		t.Fatal(err)
	}
	ren.Metadata.Name = "foo"
	_, err = s.Update(ctx, store.TypeSandbox, ren, 0)
	WantCode(t, err, codes.AlreadyExists)
}

func testUpdateCAS(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("sb-1", "default", "foo", nil)); err != nil {
		t.Fatal(err)
	}
	got, wr, err := store.UpdateCASAs(ctx, s, store.TypeSandbox, "sb-1", 0, newSandbox, func(sb *openshellv1.Sandbox) error {
		sb.Status.Phase = openshellv1.SandboxPhase(2)
		return nil
	})
	if err != nil || wr.ResourceVersion != 2 || got.GetMetadata().GetResourceVersion() != 2 {
		t.Fatalf("UpdateCAS = %v, %+v, %v; want rv 2", got, wr, err)
	}
	_, err = s.UpdateCAS(ctx, store.TypeSandbox, "sb-1", 1, newSandbox(), func(proto.Message) error {
		t.Error("mutate called despite version mismatch")
		return nil
	})
	WantCode(t, err, codes.Aborted)
	mutations := []struct {
		name string
		fn   func(*openshellv1.Sandbox)
	}{
		{"rename", func(sb *openshellv1.Sandbox) { sb.Metadata.Name = "bar" }},
		{"move workspace", func(sb *openshellv1.Sandbox) { sb.Metadata.Workspace = "other" }},
		{"change id", func(sb *openshellv1.Sandbox) { sb.Metadata.Id = "x" }},
	}
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			_, _, err := store.UpdateCASAs(ctx, s, store.TypeSandbox, "sb-1", 2, newSandbox, func(sb *openshellv1.Sandbox) error { m.fn(sb); return nil })
			WantCode(t, err, codes.InvalidArgument)
		})
	}
	errMutate := errors.New("mutate refused")
	if _, err := s.UpdateCAS(ctx, store.TypeSandbox, "sb-1", 0, newSandbox(), func(proto.Message) error { return errMutate }); !errors.Is(err, errMutate) {
		t.Fatalf("UpdateCAS with failing mutate = %v, want %v", err, errMutate)
	}
	WantCode(t, func() error {
		_, err := s.UpdateCAS(ctx, store.TypeSandbox, "missing", 0, newSandbox(), nil)
		return err
	}(), codes.NotFound)
	after, err := store.GetAs(ctx, s, store.TypeSandbox, "sb-1", newSandbox)
	if err != nil || after.GetMetadata().GetResourceVersion() != 2 || after.GetMetadata().GetName() != "foo" {
		t.Fatalf("after refused mutations: %v, %v; want foo at rv 2", after, err)
	}
}

func testDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, id := range []string{"a", "b"} {
		if _, err := s.Create(ctx, store.TypeSandbox, Sandbox(id, "default", fmt.Sprint("n", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	err := s.DeleteIf(ctx, store.TypeSandbox, "a", 7)
	WantCode(t, err, codes.Aborted)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Current != 1 {
		t.Fatalf("DeleteIf mismatch = %v, want conflict with current 1", err)
	}
	if err := s.DeleteIf(ctx, store.TypeSandbox, "a", 1); err != nil {
		t.Fatalf("DeleteIf: %v", err)
	}
	WantCode(t, s.DeleteIf(ctx, store.TypeSandbox, "a", 1), codes.NotFound)
	WantCode(t, s.Get(ctx, store.TypeSandbox, "a", newSandbox()), codes.NotFound)
	if ok, err := s.Delete(ctx, store.TypeSandbox, "b"); !ok || err != nil {
		t.Fatalf("Delete = %v, %v; want true", ok, err)
	}
	if ok, err := s.Delete(ctx, store.TypeSandbox, "b"); ok || err != nil {
		t.Fatalf("second Delete = %v, %v; want false, nil", ok, err)
	}
	// The name is free again.
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("c", "default", "n0", nil)); err != nil {
		t.Fatalf("Create after delete: %v", err)
	}
}

func testBadInput(t *testing.T, s store.Store) {
	ctx := t.Context()
	long := strings.Repeat("x", 64)
	tests := []struct {
		name string
		err  error
	}{
		{"create empty type", func() error { _, err := s.Create(ctx, "", Sandbox("a", "", "a", nil)); return err }()},
		{"get empty type", s.Get(ctx, "", "a", newSandbox())},
		{"list empty type", func() error { _, err := s.List(ctx, "", store.ListOptions{}); return err }()},
		{"message without metadata", func() error { _, err := s.Create(ctx, store.TypeSandbox, &openshellv1.SandboxSpec{}); return err }()},
		{"oversized label value", func() error {
			_, err := s.Create(ctx, store.TypeSandbox, Sandbox("a", "", "a", map[string]string{"k": long}))
			return err
		}()},
		{"oversized label key", func() error {
			_, err := s.Create(ctx, store.TypeSandbox, Sandbox("a", "", "a", map[string]string{long: "v"}))
			return err
		}()},
		{"bad selector", func() error {
			_, err := s.List(ctx, store.TypeSandbox, store.ListOptions{LabelSelector: "a=b,oops"})
			return err
		}()},
		{"negative offset", func() error { _, err := s.List(ctx, store.TypeSandbox, store.ListOptions{Offset: -1}); return err }()},
		{"scoped without scope", func() error { _, err := s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxPolicy}); return err }()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { WantCode(t, tt.err, codes.InvalidArgument) })
	}
	// A rejected request leaves nothing behind.
	WantCode(t, s.Get(ctx, store.TypeSandbox, "a", newSandbox()), codes.NotFound)
	_, err := s.List(ctx, store.TypeSandbox, store.ListOptions{LabelSelector: "a=b,oops"})
	if !strings.Contains(err.Error(), `"oops"`) {
		t.Fatalf("selector error %q does not name the bad pair", err)
	}
}

func testListPaging(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Same created_at for b/a to check the name tiebreak; inserted out of order.
	items := []struct {
		id, ws, name string
		created      int64
	}{
		{"3", "default", "c", 300}, {"2", "default", "b", 200}, {"1", "default", "a", 200},
		{"4", "default", "d", 400}, {"5", "other", "e", 100},
	}
	for _, it := range items {
		sb := Sandbox(it.id, it.ws, it.name, nil)
		sb.Metadata.CreatedAtMs = it.created
		if _, err := s.Create(ctx, store.TypeSandbox, sb); err != nil {
			t.Fatal(err)
		}
	}
	names := func(opts store.ListOptions) []string {
		t.Helper()
		got, err := store.ListAs(ctx, s, store.TypeSandbox, opts, newSandbox)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		var out []string
		for _, sb := range got {
			if sb.GetMetadata().GetResourceVersion() != 1 {
				t.Fatalf("listed %v without hydrated resource version", sb.GetMetadata())
			}
			out = append(out, sb.GetMetadata().GetName())
		}
		return out
	}
	tests := []struct {
		name string
		opts store.ListOptions
		want []string
	}{
		{"workspace", store.ListOptions{Workspace: "default"}, []string{"a", "b", "c", "d"}},
		{"page 1", store.ListOptions{Workspace: "default", Limit: 2}, []string{"a", "b"}},
		{"page 2", store.ListOptions{Workspace: "default", Limit: 2, Offset: 2}, []string{"c", "d"}},
		{"past end", store.ListOptions{Workspace: "default", Limit: 2, Offset: 4}, nil},
		{"all workspaces", store.ListOptions{AllWorkspaces: true}, []string{"e", "a", "b", "c", "d"}},
		{"empty workspace", store.ListOptions{Workspace: "nobody"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, names(tt.opts)); diff != "" {
				t.Fatalf("List(%+v) names (-want +got):\n%s", tt.opts, diff)
			}
		})
	}
	objs, err := s.List(ctx, store.TypeSandbox, store.ListOptions{Workspace: "default", Limit: 1})
	if err != nil || len(objs) != 1 || objs[0].ID != "1" || objs[0].Workspace != "default" || objs[0].CreatedAtMs != 200 {
		t.Fatalf("List raw = %+v, %v", objs, err)
	}
	if got := store.Limit(5000); got != store.MaxLimit {
		t.Fatalf("Limit(5000) = %d, want %d", got, store.MaxLimit)
	}
}

func testListSelectors(t *testing.T, s store.Store) {
	ctx := t.Context()
	labels := []map[string]string{
		{"team": "a", "env": "prod"},
		{"team": "a", "env": "dev"},
		{"team": "b", "env": "prod", "app.kubernetes.io/name": "x"},
		nil,
	}
	for i, l := range labels {
		sb := Sandbox(fmt.Sprint("sb", i), "default", fmt.Sprint("n", i), l)
		sb.Metadata.CreatedAtMs = int64(i + 1)
		if _, err := s.Create(ctx, store.TypeSandbox, sb); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		sel  string
		want []string
	}{
		{"", []string{"sb0", "sb1", "sb2", "sb3"}},
		{"team=a", []string{"sb0", "sb1"}},
		{"team=a,env=prod", []string{"sb0"}},
		{" env = prod ", []string{"sb0", "sb2"}},
		{"app.kubernetes.io/name=x", []string{"sb2"}},
		{"team=c", nil},
		{"team=a,env=prod,missing=1", nil},
	}
	for _, tt := range tests {
		t.Run(tt.sel, func(t *testing.T) {
			objs, err := s.List(ctx, store.TypeSandbox, store.ListOptions{Workspace: "default", LabelSelector: tt.sel})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, o.ID)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("selector %q (-want +got):\n%s", tt.sel, diff)
			}
		})
	}
	objs, err := s.List(ctx, store.TypeSandbox, store.ListOptions{AllWorkspaces: true, LabelSelector: "team=b"})
	if err != nil || len(objs) != 1 || objs[0].Labels["app.kubernetes.io/name"] != "x" {
		t.Fatalf("List labels = %+v, %v", objs, err)
	}
}

func testUnknownFields(t *testing.T, s store.Store) {
	ctx := t.Context()
	sb := Sandbox("u1", "default", "u", nil)
	var unknown []byte
	unknown = protowire.AppendTag(unknown, 999, protowire.BytesType)
	unknown = protowire.AppendString(unknown, "from a newer gateway")
	unknown = protowire.AppendTag(unknown, 1000, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 42)
	sb.ProtoReflect().SetUnknown(unknown)
	var specUnknown []byte
	specUnknown = protowire.AppendTag(specUnknown, 77, protowire.BytesType)
	specUnknown = protowire.AppendString(specUnknown, "nested")
	sb.Spec.ProtoReflect().SetUnknown(specUnknown)
	if _, err := s.Create(ctx, store.TypeSandbox, sb); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got, err := store.GetAs(ctx, s, store.TypeSandbox, "u1", newSandbox)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(unknown, []byte(got.ProtoReflect().GetUnknown())); diff != "" {
			t.Fatalf("%s: unknown fields (-want +got):\n%s", when, diff)
		}
		if diff := cmp.Diff(specUnknown, []byte(got.GetSpec().ProtoReflect().GetUnknown())); diff != "" {
			t.Fatalf("%s: nested unknown fields (-want +got):\n%s", when, diff)
		}
	}
	check("after create")
	if _, err := s.UpdateCAS(ctx, store.TypeSandbox, "u1", 0, newSandbox(), func(m proto.Message) error {
		m.(*openshellv1.Sandbox).Spec.LogLevel = "debug"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("after UpdateCAS")
}

func testScoped(t *testing.T, s store.Store) {
	ctx := t.Context()
	const typ = store.TypeSandboxPolicy
	createSandboxes(t, s, "sb-1", "sb-2")
	for i := range 3 {
		rec, err := s.CreateScoped(ctx, store.Record{Type: typ, Scope: "sb-1", Status: "pending", Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Version != int64(i+1) || rec.ID == "" || rec.ResourceVersion != 1 {
			t.Fatalf("CreateScoped #%d = %+v, want version %d", i, rec, i+1)
		}
	}
	if _, err := s.CreateScoped(ctx, store.Record{Type: typ, Scope: "sb-2", Status: "pending"}); err != nil {
		t.Fatal(err)
	}
	latest, err := s.GetLatestScoped(ctx, typ, "sb-1", "")
	if err != nil || latest.Version != 3 || !cmp.Equal(latest.Payload, []byte{2}) {
		t.Fatalf("GetLatestScoped = %+v, %v; want version 3", latest, err)
	}
	WantCode(t, func() error { _, err := s.GetLatestScoped(ctx, typ, "sb-1", "loaded"); return err }(), codes.NotFound)
	WantCode(t, func() error { _, err := s.GetLatestScoped(ctx, typ, "nobody", ""); return err }(), codes.NotFound)

	// Mark v2 loaded, supersede everything below v3 that is not failed.
	list, err := s.ListScoped(ctx, typ, "sb-1", 0, 0)
	if err != nil || len(list) != 3 || list[0].Version != 3 || list[2].Version != 1 {
		t.Fatalf("ListScoped = %+v, %v; want versions 3,2,1", list, err)
	}
	v2 := list[1]
	v2.Status = "loaded"
	if wr, err := s.UpdateScoped(ctx, v2, 1); err != nil || wr.ResourceVersion != 2 {
		t.Fatalf("UpdateScoped = %+v, %v", wr, err)
	}
	WantCode(t, func() error { _, err := s.UpdateScoped(ctx, v2, 1); return err }(), codes.Aborted)
	got, err := s.GetLatestScoped(ctx, typ, "sb-1", "loaded")
	if err != nil || got.Version != 2 || got.ID != v2.ID {
		t.Fatalf("GetLatestScoped(loaded) = %+v, %v; want v2", got, err)
	}
	if got2, err := s.GetScoped(ctx, typ, v2.ID); err != nil || got2.Status != "loaded" {
		t.Fatalf("GetScoped = %+v, %v", got2, err)
	}
	n, err := s.SupersedeScoped(ctx, typ, "sb-1", 3, "superseded", "loaded")
	if err != nil || n != 1 {
		t.Fatalf("SupersedeScoped(from loaded) = %d, %v; want 1", n, err)
	}
	n, err = s.SupersedeScoped(ctx, typ, "sb-1", 3, "superseded")
	if err != nil || n != 1 {
		t.Fatalf("SupersedeScoped(any) = %d, %v; want 1 (v1)", n, err)
	}
	list, _ = s.ListScoped(ctx, typ, "sb-1", 0, 0)
	var statuses []string
	for _, r := range list {
		statuses = append(statuses, r.Status)
	}
	if diff := cmp.Diff([]string{"pending", "superseded", "superseded"}, statuses); diff != "" {
		t.Fatalf("statuses (-want +got):\n%s", diff)
	}
	if page, _ := s.ListScoped(ctx, typ, "sb-1", 1, 1); len(page) != 1 || page[0].Version != 2 {
		t.Fatalf("ListScoped page = %+v, want v2", page)
	}
	n, err = s.DeleteByScope(ctx, typ, "sb-1")
	if err != nil || n != 3 {
		t.Fatalf("DeleteByScope = %d, %v; want 3", n, err)
	}
	if rest, _ := s.ListScoped(ctx, typ, "sb-2", 0, 0); len(rest) != 1 {
		t.Fatalf("DeleteByScope touched another scope: %+v", rest)
	}
	// Versions restart after the scope is emptied.
	if rec, err := s.CreateScoped(ctx, store.Record{Type: typ, Scope: "sb-1"}); err != nil || rec.Version != 1 {
		t.Fatalf("CreateScoped after delete = %+v, %v; want version 1", rec, err)
	}
}

func testRecordHit(t *testing.T, s store.Store) {
	ctx := t.Context()
	createSandboxes(t, s, "sb-1", "sb-2")
	rec := store.Record{Type: store.TypeDraftPolicyChunk, Scope: "sb-1", DedupKey: "api.example.com:443", Status: "pending", Payload: []byte("rule")}
	first, created, err := s.RecordHit(ctx, rec)
	if err != nil || !created || first.HitCount != 1 {
		t.Fatalf("first RecordHit = %+v, %v, %v", first, created, err)
	}
	second, created, err := s.RecordHit(ctx, rec)
	if err != nil || created || second.HitCount != 2 || second.ID != first.ID {
		t.Fatalf("second RecordHit = %+v, %v, %v; want same id, 2 hits", second, created, err)
	}
	many := rec
	many.HitCount, many.Payload = 5, []byte("other rule")
	third, created, err := s.RecordHit(ctx, many)
	if err != nil || created || third.HitCount != 7 || string(third.Payload) != "rule" {
		t.Fatalf("RecordHit(hit_count 5) = %+v, %v, %v; want 7 hits, payload unchanged", third, created, err)
	}
	other := rec
	other.Scope = "sb-2"
	if _, created, err := s.RecordHit(ctx, other); err != nil || !created {
		t.Fatalf("RecordHit in other scope = %v, %v; want created", created, err)
	}
	WantCode(t, func() error {
		_, _, err := s.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: "x"})
		return err
	}(), codes.InvalidArgument)
}

func policyRevision(sandboxID string, ann map[string]string, fault func(string) error) store.PolicyRevision {
	return store.PolicyRevision{
		Revision:        store.Record{Type: store.TypeSandboxPolicy, Scope: sandboxID, Status: "pending", Payload: []byte("new")},
		Backfill:        &store.Record{Status: "loaded", Payload: []byte("initial")},
		Project:         &store.Projection{Type: store.TypeSandbox, ID: sandboxID, Msg: newSandbox(), Mutate: store.SetAnnotations(ann)},
		SupersedeStatus: "superseded",
		Fault:           fault,
	}
}

func testPolicyRevision(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("sb-1", "default", "foo", nil)); err != nil {
		t.Fatal(err)
	}
	res, err := s.CommitPolicyRevision(ctx, policyRevision("sb-1", map[string]string{"policy-version": "2"}, nil))
	if err != nil {
		t.Fatalf("CommitPolicyRevision: %v", err)
	}
	if res.Backfilled == nil || res.Backfilled.Version != 1 || res.Revision.Version != 2 || res.Projected.ResourceVersion != 2 || res.Superseded != 1 {
		t.Fatalf("CommitPolicyRevision = %+v, backfill %+v", res, res.Backfilled)
	}
	sb, err := store.GetAs(ctx, s, store.TypeSandbox, "sb-1", newSandbox)
	if err != nil || sb.GetMetadata().GetAnnotations()["policy-version"] != "2" || sb.GetMetadata().GetResourceVersion() != 2 {
		t.Fatalf("projected sandbox = %v, %v", sb.GetMetadata(), err)
	}
	// Second revision: no backfill, v2 superseded.
	res, err = s.CommitPolicyRevision(ctx, policyRevision("sb-1", map[string]string{"policy-version": "3"}, nil))
	if err != nil || res.Backfilled != nil || res.Revision.Version != 3 || res.Superseded != 1 {
		t.Fatalf("second CommitPolicyRevision = %+v, %v", res, err)
	}
	// A stale projection version aborts the whole revision.
	rev := policyRevision("sb-1", map[string]string{"policy-version": "4"}, nil)
	rev.Project.ExpectedRV = 1
	_, err = s.CommitPolicyRevision(ctx, rev)
	WantCode(t, err, codes.Aborted)
	if latest, _ := s.GetLatestScoped(ctx, store.TypeSandboxPolicy, "sb-1", ""); latest.Version != 3 {
		t.Fatalf("after aborted revision latest = %d, want 3", latest.Version)
	}
	// Projection onto a missing sandbox is NotFound and writes nothing.
	_, err = s.CommitPolicyRevision(ctx, policyRevision("missing", nil, nil))
	WantCode(t, err, codes.NotFound)
	if recs, _ := s.ListScoped(ctx, store.TypeSandboxPolicy, "missing", 0, 0); len(recs) != 0 {
		t.Fatalf("revision for missing sandbox left %d records", len(recs))
	}
}

func testPolicyRevisionRollback(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, step := range []string{"backfill", "revision", "project", "supersede"} {
		t.Run(step, func(t *testing.T) {
			id := "sb-" + step
			if _, err := s.Create(ctx, store.TypeSandbox, Sandbox(id, "default", id, nil)); err != nil {
				t.Fatal(err)
			}
			// Supersede only runs when there is an older revision.
			if step == "supersede" {
				if _, err := s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxPolicy, Scope: id, Status: "loaded"}); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := s.ListScoped(ctx, store.TypeSandboxPolicy, id, 0, 0)
			injected := errors.New("injected fault")
			called := false
			_, err := s.CommitPolicyRevision(ctx, policyRevision(id, map[string]string{"k": "v"}, func(got string) error {
				if got == step {
					called = true
					return injected
				}
				return nil
			}))
			if !called || !errors.Is(err, injected) {
				t.Fatalf("CommitPolicyRevision = %v (fault called %v), want injected fault", err, called)
			}
			after, err := s.ListScoped(ctx, store.TypeSandboxPolicy, id, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, after); diff != "" {
				t.Fatalf("records changed by rolled-back revision (-before +after):\n%s", diff)
			}
			sb, err := store.GetAs(ctx, s, store.TypeSandbox, id, newSandbox)
			if err != nil || sb.GetMetadata().GetResourceVersion() != 1 || len(sb.GetMetadata().GetAnnotations()) != 0 {
				t.Fatalf("sandbox changed by rolled-back revision: %v, %v", sb.GetMetadata(), err)
			}
		})
	}
	// The store still works after rollbacks.
	if _, err := s.CommitPolicyRevision(ctx, policyRevision("sb-project", map[string]string{"k": "v"}, nil)); err != nil {
		t.Fatalf("commit after rollbacks: %v", err)
	}
}

func testLease(t *testing.T, s store.Store) {
	ctx := t.Context()
	l, err := s.AcquireLease(ctx, "reconciler", "replica-a", time.Hour)
	if err != nil || l.Holder != "replica-a" || l.ResourceVersion != 1 {
		t.Fatalf("AcquireLease = %+v, %v", l, err)
	}
	_, err = s.AcquireLease(ctx, "reconciler", "replica-b", time.Hour)
	var held *store.LeaseHeldError
	if !errors.As(err, &held) || held.Lease.Holder != "replica-a" {
		t.Fatalf("AcquireLease by b = %v, want held by replica-a", err)
	}
	WantCode(t, err, codes.FailedPrecondition)
	l2, err := s.RenewLease(ctx, l, time.Hour)
	if err != nil || l2.ResourceVersion != 2 {
		t.Fatalf("RenewLease = %+v, %v", l2, err)
	}
	// Renewing with a stale lease loses.
	_, err = s.RenewLease(ctx, l, time.Hour)
	WantCode(t, err, codes.Aborted)
	// Re-acquire by the holder is a renewal.
	l3, err := s.AcquireLease(ctx, "reconciler", "replica-a", time.Hour)
	if err != nil || l3.ResourceVersion != 3 {
		t.Fatalf("AcquireLease by holder = %+v, %v", l3, err)
	}
	WantCode(t, s.ReleaseLease(ctx, l2), codes.Aborted)
	if err := s.ReleaseLease(ctx, l3); err != nil {
		t.Fatalf("ReleaseLease: %v", err)
	}
	lb, err := s.AcquireLease(ctx, "reconciler", "replica-b", time.Millisecond)
	if err != nil || lb.Holder != "replica-b" {
		t.Fatalf("AcquireLease after release = %+v, %v", lb, err)
	}
	// An expired lease can be taken over; poll until the ms clock passes it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		la, err := s.AcquireLease(ctx, "reconciler", "replica-a", time.Hour)
		if err == nil {
			if la.Holder != "replica-a" || la.ResourceVersion != lb.ResourceVersion+1 {
				t.Fatalf("takeover = %+v", la)
			}
			break
		}
		if !errors.As(err, &held) || time.Now().After(deadline) {
			t.Fatalf("takeover of expired lease: %v", err)
		}
	}
	_, err = s.RenewLease(ctx, lb, time.Hour)
	WantCode(t, err, codes.Aborted)
}

// Increment does one read-modify-write of the counter in sandbox id's
// status.current_policy_version, retrying on conflict.
func Increment(ctx context.Context, s store.Store, id string) (conflicts int, err error) {
	for {
		_, err := s.UpdateCAS(ctx, store.TypeSandbox, id, 0, newSandbox(), func(m proto.Message) error {
			m.(*openshellv1.Sandbox).Status.CurrentPolicyVersion++
			return nil
		})
		if errors.Is(err, errdefs.ErrConflict) {
			conflicts++
			continue
		}
		return conflicts, err
	}
}

func testConcurrentIncrements(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("counter", "default", "counter", nil)); err != nil {
		t.Fatal(err)
	}
	const workers, perWorker = 8, 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conflicts int
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range perWorker {
				c, err := Increment(ctx, s, "counter")
				mu.Lock()
				conflicts += c
				mu.Unlock()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("increment: %v", err)
	}
	got, err := store.GetAs(ctx, s, store.TypeSandbox, "counter", newSandbox)
	if err != nil {
		t.Fatal(err)
	}
	if n := got.GetStatus().GetCurrentPolicyVersion(); n != workers*perWorker {
		t.Fatalf("counter = %d, want %d (lost updates)", n, workers*perWorker)
	}
	if rv := got.GetMetadata().GetResourceVersion(); rv != workers*perWorker+1 {
		t.Fatalf("resource version = %d, want %d", rv, workers*perWorker+1)
	}
	t.Logf("%d increments, %d conflicts retried", workers*perWorker, conflicts)
}

func testConcurrentScoped(t *testing.T, s store.Store) {
	ctx := t.Context()
	createSandboxes(t, s, "sb")
	const workers, perWorker = 4, 25
	var wg sync.WaitGroup
	versions := make(chan int64, workers*perWorker)
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range perWorker {
				rec, err := s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxPolicy, Scope: "sb", Status: "pending"})
				if err != nil {
					errs <- err
					return
				}
				versions <- rec.Version
			}
		})
	}
	wg.Wait()
	close(errs)
	close(versions)
	for err := range errs {
		t.Fatalf("CreateScoped: %v", err)
	}
	seen := map[int64]bool{}
	for v := range versions {
		if seen[v] {
			t.Fatalf("version %d assigned twice", v)
		}
		seen[v] = true
	}
	for v := int64(1); v <= workers*perWorker; v++ {
		if !seen[v] {
			t.Fatalf("version %d never assigned (got %d versions)", v, len(seen))
		}
	}
}

// ownedRecords writes records of every sandbox-owned type in scope id: two
// policy revisions (backfill and revision), one settings record and one
// draft policy chunk.
func ownedRecords(t testing.TB, s store.Store, id string) {
	t.Helper()
	ctx := t.Context()
	if _, err := s.CommitPolicyRevision(ctx, store.PolicyRevision{
		Revision: store.Record{Type: store.TypeSandboxPolicy, Scope: id, Status: "pending"},
		Backfill: &store.Record{Status: "loaded"},
	}); err != nil {
		t.Fatalf("CommitPolicyRevision(%s): %v", id, err)
	}
	if _, err := s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxSettings, Scope: id}); err != nil {
		t.Fatalf("CreateScoped(settings, %s): %v", id, err)
	}
	if _, _, err := s.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: id, DedupKey: "api.example.com:443"}); err != nil {
		t.Fatalf("RecordHit(%s): %v", id, err)
	}
	if _, _, err := s.RecordHit(ctx, store.Record{Type: store.TypeServiceEndpoint, Scope: id, DedupKey: id + "--web"}); err != nil {
		t.Fatalf("RecordHit(service endpoint, %s): %v", id, err)
	}
}

// countOwned counts the records of every sandbox-owned type in scope id.
func countOwned(t testing.TB, s store.Store, id string) int {
	t.Helper()
	n := 0
	for _, typ := range store.OwnedRecordTypes(store.TypeSandbox) {
		recs, err := s.ListScoped(t.Context(), typ, id, store.MaxLimit, 0)
		if err != nil {
			t.Fatalf("ListScoped(%s, %s): %v", typ, id, err)
		}
		n += len(recs)
	}
	return n
}

// testOwnedRecords: a sandbox's scoped records (policy revisions,
// settings, draft policy chunks, service endpoints) go with the sandbox row, by Delete and by
// DeleteIf; records cannot be added for a sandbox that does not exist;
// records of types without an owner stay.
func testOwnedRecords(t *testing.T, s store.Store) {
	ctx := t.Context()
	if got := store.OwnedRecordTypes(store.TypeSandbox); len(got) != 4 {
		t.Fatalf("OwnedRecordTypes(sandbox) = %v, want policy, settings, draft chunks and service endpoints", got)
	}
	createSandboxes(t, s, "a", "b")
	ownedRecords(t, s, "a")
	ownedRecords(t, s, "b")
	if _, err := s.CreateScoped(ctx, store.Record{Type: store.TypeGatewaySettings, Scope: "a"}); err != nil {
		t.Fatalf("CreateScoped(gateway settings): %v", err)
	}
	if n := countOwned(t, s, "a"); n != 5 {
		t.Fatalf("records of a = %d, want 5 (2 policy revisions, settings, draft chunk, service endpoint)", n)
	}

	// A stale DeleteIf removes nothing.
	WantCode(t, s.DeleteIf(ctx, store.TypeSandbox, "a", 9), codes.Aborted)
	if n := countOwned(t, s, "a"); n != 5 {
		t.Fatalf("records of a after a conflicting DeleteIf = %d, want 5", n)
	}
	if err := s.DeleteIf(ctx, store.TypeSandbox, "a", 1); err != nil {
		t.Fatalf("DeleteIf(a): %v", err)
	}
	if n := countOwned(t, s, "a"); n != 0 {
		t.Fatalf("records of a after DeleteIf = %d, want 0", n)
	}
	if n := countOwned(t, s, "b"); n != 5 {
		t.Fatalf("records of b after deleting a = %d, want 5", n)
	}
	if recs, err := s.ListScoped(ctx, store.TypeGatewaySettings, "a", 0, 0); err != nil || len(recs) != 1 {
		t.Fatalf("gateway settings in scope a = %d (%v), want 1: only owned types go with the sandbox", len(recs), err)
	}
	if ok, err := s.Delete(ctx, store.TypeSandbox, "b"); !ok || err != nil {
		t.Fatalf("Delete(b) = %v, %v", ok, err)
	}
	if n := countOwned(t, s, "b"); n != 0 {
		t.Fatalf("records of b after Delete = %d, want 0", n)
	}

	// Nothing can be added for a sandbox that is gone.
	_, err := s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxPolicy, Scope: "a"})
	WantCode(t, err, codes.NotFound)
	_, _, err = s.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: "a", DedupKey: "k"})
	WantCode(t, err, codes.NotFound)
	_, err = s.CommitPolicyRevision(ctx, store.PolicyRevision{Revision: store.Record{Type: store.TypeSandboxPolicy, Scope: "a"}})
	WantCode(t, err, codes.NotFound)
	if n := countOwned(t, s, "a"); n != 0 {
		t.Fatalf("records of deleted a after refused writes = %d, want 0", n)
	}
}

// testOwnedRecordsConcurrentDelete races record writers against the
// deletion of their sandbox: whichever order the database picks, no
// record outlives the sandbox.
func testOwnedRecordsConcurrentDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	const rounds, writers = 10, 3
	for round := range rounds {
		id := fmt.Sprintf("race-%d", round)
		createSandboxes(t, s, id)
		var wg sync.WaitGroup
		errs := make(chan error, writers*3+1)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				for i := range 3 {
					var err error
					switch i {
					case 0:
						_, err = s.CommitPolicyRevision(ctx, store.PolicyRevision{Revision: store.Record{Type: store.TypeSandboxPolicy, Scope: id}})
					case 1:
						_, err = s.CreateScoped(ctx, store.Record{Type: store.TypeSandboxSettings, Scope: id})
					case 2:
						_, _, err = s.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: id, DedupKey: fmt.Sprint("k", w)})
					}
					if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
						errs <- err
					}
				}
			})
		}
		wg.Go(func() {
			<-start
			if ok, err := s.Delete(ctx, store.TypeSandbox, id); err != nil {
				errs <- err
			} else if !ok {
				errs <- fmt.Errorf("Delete(%s) removed nothing", id)
			}
		})
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := countOwned(t, s, id); n != 0 {
			t.Fatalf("round %d: %d records outlived sandbox %s", round, n, id)
		}
	}
}
