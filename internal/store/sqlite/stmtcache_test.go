package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func openDB(t *testing.T, path string) *sqlDB {
	t.Helper()
	s, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.DB().(*sqlDB)
}

// TestStmtCacheInTransaction: a query first run inside a transaction is
// run unprepared there (preparing would need a second connection; an
// in-memory database has one) and prepared once the transaction ends;
// run again in a transaction it uses that statement.
func TestStmtCacheInTransaction(t *testing.T) {
	for _, path := range []string{Memory, filepath.Join(t.TempDir(), "gateway.db")} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			d := openDB(t, path)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			const q = "SELECT 40 + ?"
			for i := range 2 {
				tx, err := d.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var n int64
				if err := tx.QueryRow(ctx, q, 2).Scan(&n); err != nil || n != 42 {
					t.Fatalf("run %d: QueryRow(%q) = %d, %v; want 42", i, q, n, err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if d.stmts.lookup(q) == nil {
					t.Fatalf("run %d: %q not prepared after the transaction", i, q)
				}
			}
		})
	}
}

// TestStmtCacheBound: past maxCachedStmts query texts, queries run
// unprepared and the cache does not grow; a failing query is not kept
// and fails as it would unprepared.
func TestStmtCacheBound(t *testing.T) {
	d := openDB(t, filepath.Join(t.TempDir(), "gateway.db"))
	ctx := t.Context()
	for i := range maxCachedStmts + 10 {
		var n int64
		if err := d.QueryRow(ctx, fmt.Sprintf("SELECT %d", i)).Scan(&n); err != nil || n != int64(i) {
			t.Fatalf("SELECT %d = %d, %v", i, n, err)
		}
	}
	if n := len(d.stmts.m); n != maxCachedStmts {
		t.Errorf("cached statements = %d, want %d", n, maxCachedStmts)
	}
	d2 := openDB(t, filepath.Join(t.TempDir(), "gateway2.db"))
	if _, err := d2.Exec(ctx, "SELECT * FROM no_such_table"); err == nil {
		t.Error("query of a missing table succeeded")
	}
	if d2.stmts.lookup("SELECT * FROM no_such_table") != nil {
		t.Error("a statement that failed to prepare was kept")
	}
}
