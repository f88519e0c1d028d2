package sqlite_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
	"github.com/openshell-go/openshell/internal/store/storetest"
	"github.com/openshell-go/openshell/internal/store/storetesting"
)

func TestUnconditionalPutIsTestOnly(t *testing.T) {
	ctx := t.Context()
	s := openFile(t, sqlite.Memory)
	wr, err := storetesting.Put(ctx, s, store.TypeSandbox, storetest.Sandbox("a", "default", "a", nil))
	if err != nil || wr.ResourceVersion != 1 {
		t.Fatalf("Put (insert) = %+v, %v", wr, err)
	}
	sb := storetest.Sandbox("a", "default", "a", nil)
	sb.Spec.LogLevel = "overwritten"
	if wr, err := storetesting.Put(ctx, s, store.TypeSandbox, sb); err != nil || wr.ResourceVersion != 2 {
		t.Fatalf("Put (overwrite) = %+v, %v; want rv 2", wr, err)
	}
	got := &openshellv1.Sandbox{}
	if err := s.Get(ctx, store.TypeSandbox, "a", got); err != nil || got.GetSpec().GetLogLevel() != "overwritten" {
		t.Fatalf("Get after Put = %v, %v", got, err)
	}
	// A key not made by storetesting is refused.
	_, err = s.PutUnconditional(context.Background(), storetesting.Key{}, store.TypeSandbox, sb)
	storetest.WantCode(t, err, codes.PermissionDenied)
}
