package sqlstore

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// LoadMigrations reads files named NNNN_name.sql from dir in fsys.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migration version %d appears twice", out[i].Version)
		}
	}
	return out, nil
}

// Migrate applies the migrations newer than the recorded schema version,
// each in its own transaction. lock, when not empty, is executed first in
// each transaction to serialize concurrent migrators (PostgreSQL replicas).
func Migrate(ctx context.Context, db DB, migrations []Migration, lock string) error {
	if err := createMigrationsTable(ctx, db, lock); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for _, m := range migrations {
		if err := applyOne(ctx, db, m, lock); err != nil {
			return fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}

func applyOne(ctx context.Context, db DB, m Migration, lock string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if lock != "" {
		if _, err := tx.Exec(ctx, lock); err != nil {
			return err
		}
	}
	var n int64
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT COUNT(*) FROM schema_migrations WHERE version = %d`, m.Version)).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return tx.Rollback(ctx)
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES (%d, '%s', %d)`,
		m.Version, strings.ReplaceAll(m.Name, "'", ""), time.Now().UnixMilli())); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func createMigrationsTable(ctx context.Context, db DB, lock string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if lock != "" {
		if _, err := tx.Exec(ctx, lock); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
