package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/storetest"
)

// BenchmarkStore compares the store with the same statements run raw on
// its *sql.DB (WAL file database).
func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) (store.Store, storetest.Raw) {
		s := openFile(b, filepath.Join(b.TempDir(), "bench.db"))
		db := s.SQL()
		return s, storetest.Raw{
			Update: func(ctx context.Context, id string, rv uint64, payload []byte, labels string) error {
				var newRV, created int64
				err := db.QueryRowContext(ctx, `UPDATE objects SET workspace = ?, name = ?, labels = ?, payload = ?, updated_at_ms = ?, resource_version = resource_version + 1 WHERE object_type = ? AND id = ? AND resource_version = ? RETURNING resource_version, created_at_ms`,
					"bench", "raw", labels, payload, time.Now().UnixMilli(), store.TypeSandbox, id, int64(rv)).Scan(&newRV, &created)
				if err == nil && uint64(newRV) != rv+1 {
					err = fmt.Errorf("raw update: rv %d, want %d", newRV, rv+1)
				}
				return err
			},
			Get: func(ctx context.Context, id string) error {
				var payload []byte
				var rv int64
				return db.QueryRowContext(ctx, `SELECT payload, resource_version FROM objects WHERE object_type = ? AND id = ?`, store.TypeSandbox, id).Scan(&payload, &rv)
			},
			ListTeamProd: func(ctx context.Context) (int, error) {
				rows, err := db.QueryContext(ctx, `SELECT id, workspace, name, labels, resource_version, created_at_ms, updated_at_ms, payload FROM objects WHERE object_type = ? AND workspace = ? AND (json_extract(labels, ?) = ? AND json_extract(labels, ?) = ?) ORDER BY created_at_ms, COALESCE(name, ''), id LIMIT ? OFFSET ?`,
					store.TypeSandbox, "bench", `$."env"`, "prod", `$."team"`, "t4", 100, 0)
				if err != nil {
					return 0, err
				}
				defer rows.Close()
				n := 0
				for rows.Next() {
					var id, ws, labels string
					var name *string
					var rv, c, u int64
					var payload []byte
					if err := rows.Scan(&id, &ws, &name, &labels, &rv, &c, &u, &payload); err != nil {
						return 0, err
					}
					n++
				}
				return n, rows.Err()
			},
		}
	})
}
