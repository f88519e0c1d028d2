package lifecycle

import (
	"fmt"
	"path/filepath"
	"testing"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/postgres"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
	"github.com/openshell-go/openshell/internal/store/sqlite"
	"github.com/openshell-go/openshell/internal/store/sqlstore"
)

// sqlStore is a store whose table the test can count.
type sqlStore interface {
	store.Store
	DB() sqlstore.DB
}

// countRows counts the rows of the objects table by object type.
func countRows(t testing.TB, st sqlStore) map[string]int {
	t.Helper()
	rows, err := st.DB().Query(t.Context(), `SELECT object_type, COUNT(*) FROM objects GROUP BY object_type`)
	if err != nil {
		t.Fatalf("count rows: %v", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		out[typ] = int(n)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("count rows: %v", err)
	}
	return out
}

// Issue 13, defect 10: deleting every sandbox through the engine leaves no
// row behind, scoped records (policy revisions, settings, draft policy
// chunks) included, on SQLite and PostgreSQL.
func TestDeletedSandboxesLeaveNoRows(t *testing.T) {
	for _, backend := range []struct {
		name string
		open func(t *testing.T) sqlStore
	}{
		{"sqlite", func(t *testing.T) sqlStore {
			st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "gateway.db"), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		}},
		{"postgres", func(t *testing.T) sqlStore {
			st, err := postgres.Open(t.Context(), postgrestest.NewDatabase(t), postgres.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		}},
	} {
		t.Run(backend.name, func(t *testing.T) {
			ctx := t.Context()
			st := backend.open(t)
			e, err := New(ctx, Options{Store: ObjectStore{S: st}, Driver: newFakeDriver()})
			if err != nil {
				t.Fatal(err)
			}
			const sandboxes, revisions = 8, 12
			var names []string
			for i := range sandboxes {
				sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: fmt.Sprint("sb-", i)})
				if err != nil {
					t.Fatal(err)
				}
				id := sb.GetMetadata().GetId()
				names = append(names, sb.GetMetadata().GetName())
				for range revisions {
					if _, err := st.CommitPolicyRevision(ctx, store.PolicyRevision{
						Revision:        store.Record{Type: store.TypeSandboxPolicy, Scope: id, Status: "pending"},
						SupersedeStatus: "superseded",
					}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := st.CreateScoped(ctx, store.Record{Type: store.TypeSandboxSettings, Scope: id}); err != nil {
					t.Fatal(err)
				}
				if _, _, err := st.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: id, DedupKey: "api.example.com:443"}); err != nil {
					t.Fatal(err)
				}
			}
			before := countRows(t, st)
			if before[store.TypeSandbox] != sandboxes || before[store.TypeSandboxPolicy] != sandboxes*revisions {
				t.Fatalf("rows before deleting = %v, want %d sandboxes and %d policy revisions", before, sandboxes, sandboxes*revisions)
			}
			for _, n := range names {
				if _, err := e.Delete(ctx, "", n); err != nil {
					t.Fatalf("Delete(%s): %v", n, err)
				}
			}
			if after := countRows(t, st); len(after) != 0 {
				t.Fatalf("rows after deleting every sandbox = %v, want none", after)
			}
		})
	}
}
