package store_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

func TestMeta(t *testing.T) {
	p := &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{
		Id: "p1", Name: "n", Workspace: "w", Labels: map[string]string{"a": "b"}, ResourceVersion: 3, CreatedAtMs: 9,
	}}
	got, err := store.GetMeta(p)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Meta{ID: "p1", Name: "n", Workspace: "w", Labels: map[string]string{"a": "b"}, ResourceVersion: 3, CreatedAtMs: 9}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("GetMeta (-want +got):\n%s", diff)
	}
	// Missing metadata reads as empty and is created on write.
	sb := &openshellv1.Sandbox{}
	if m, err := store.GetMeta(sb); err != nil || m.ID != "" {
		t.Fatalf("GetMeta(empty) = %+v, %v", m, err)
	}
	if err := store.SetResourceVersion(sb, 7); err != nil || sb.GetMetadata().GetResourceVersion() != 7 {
		t.Fatalf("SetResourceVersion: %v, %v", sb.GetMetadata(), err)
	}
	if err := store.SetAnnotations(map[string]string{"x": "1", "y": "2"})(sb); err != nil {
		t.Fatal(err)
	}
	if err := store.SetAnnotations(map[string]string{"x": ""})(sb); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"y": "2"}, sb.GetMetadata().GetAnnotations()); diff != "" {
		t.Fatalf("annotations (-want +got):\n%s", diff)
	}
	if _, err := store.GetMeta(&openshellv1.SandboxSpec{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("GetMeta(no metadata field) = %v, want InvalidArgument", err)
	}
}
