package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/storetest"
)

// BenchmarkStore compares the store with the same statements run raw on
// its pgxpool.
func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) (store.Store, storetest.Raw) {
		s := openStore(b, newDatabase(b))
		pool := s.Pool()
		return s, storetest.Raw{
			Update: func(ctx context.Context, id string, rv uint64, payload []byte, labels string) error {
				var newRV, created int64
				err := pool.QueryRow(ctx, `UPDATE objects SET workspace = $1, name = $2, labels = $3::jsonb, payload = $4, updated_at_ms = $5, resource_version = resource_version + 1 WHERE object_type = $6 AND id = $7 AND resource_version = $8 RETURNING resource_version, created_at_ms`,
					"bench", "raw", labels, payload, time.Now().UnixMilli(), store.TypeSandbox, id, int64(rv)).Scan(&newRV, &created)
				if err == nil && uint64(newRV) != rv+1 {
					err = fmt.Errorf("raw update: rv %d, want %d", newRV, rv+1)
				}
				return err
			},
			Get: func(ctx context.Context, id string) error {
				var payload []byte
				var rv int64
				return pool.QueryRow(ctx, `SELECT payload, resource_version FROM objects WHERE object_type = $1 AND id = $2`, store.TypeSandbox, id).Scan(&payload, &rv)
			},
			ListTeamProd: func(ctx context.Context) (int, error) {
				rows, err := pool.Query(ctx, `SELECT id, workspace, name, labels::text, resource_version, created_at_ms, updated_at_ms, payload FROM objects WHERE object_type = $1 AND workspace = $2 AND labels @> $3::jsonb ORDER BY created_at_ms, COALESCE(name, ''), id LIMIT $4 OFFSET $5`,
					store.TypeSandbox, "bench", `{"team":"t4","env":"prod"}`, 100, 0)
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
