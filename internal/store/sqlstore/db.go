// Package sqlstore is the SQL core shared by the SQLite and PostgreSQL
// backends: every query of the store.Store contract written once against a
// small Dialect seam (placeholders, JSON label matching, unique-violation
// classification, scope locking) and a small DB seam over database/sql and
// pgx. Backends construct it with New; nothing else should.
package sqlstore

import (
	"context"
	"errors"
)

// ErrNoRows is what a Row.Scan adapter returns when the query matched
// nothing.
var ErrNoRows = errors.New("sqlstore: no rows")

// Row is a single-row result.
type Row interface {
	Scan(dest ...any) error // ErrNoRows when empty
}

// Rows is a multi-row result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements. Scan destinations used by the core are
// *string, *int64, *[]byte, *sql.NullString and *sql.NullInt64.
type Querier interface {
	Exec(ctx context.Context, q string, args ...any) (rowsAffected int64, err error)
	QueryRow(ctx context.Context, q string, args ...any) Row
	Query(ctx context.Context, q string, args ...any) (Rows, error)
}

// Tx is a write transaction (SQLite BEGIN IMMEDIATE; PostgreSQL READ
// COMMITTED with explicit row/advisory locks).
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DB is a connection pool.
type DB interface {
	Querier
	Begin(ctx context.Context) (Tx, error)
	Close() error
}

// Dialect is what differs between SQL engines.
type Dialect interface {
	// Name is "sqlite" or "postgres".
	Name() string
	// Placeholder returns the n-th (1-based) bind parameter.
	Placeholder(n int) string
	// JSONParam wraps a placeholder whose argument is JSON text.
	JSONParam(ph string) string
	// JSONText renders a JSON column as text for scanning into a string.
	JSONText(col string) string
	// LabelMatch returns a WHERE fragment matching rows whose labels
	// contain every pair of sel; bind adds an argument and returns its
	// placeholder.
	LabelMatch(sel map[string]string, bind func(any) string) string
	// UniqueViolation reports whether err is a unique-constraint
	// violation and which of "primary", "name", "version", "dedup".
	UniqueViolation(err error) (index string, ok bool)
	// LockScope serializes writers of (objType, scope) inside tx.
	LockScope(ctx context.Context, tx Querier, objType, scope string) error
	// ForUpdate is appended to a SELECT inside a transaction to lock the
	// row ("" when the transaction already holds the write lock).
	ForUpdate() string
	// Unavailable reports whether err means the database is unreachable.
	Unavailable(err error) bool
}

// Migration is one embedded, versioned schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}
