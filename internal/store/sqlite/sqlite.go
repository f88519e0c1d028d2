// Package sqlite is the SQLite backend of store.Store (modernc.org/sqlite,
// no cgo): WAL journal, busy timeout, BEGIN IMMEDIATE write transactions
// and a small pool; ":memory:" keeps one shared connection for unit tests.
// The database file and its -wal/-shm sidecars are made mode 0600 on every
// open; a missing parent directory is created with mode 0700.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Memory is the path that selects an in-memory database.
const Memory = ":memory:"

// Store is a SQLite-backed store.Store.
type Store struct {
	*sqlstore.Store
	path string
}

var _ store.Store = (*Store)(nil)

// Options tune Open.
type Options struct {
	Logger      *slog.Logger
	MaxConns    int           // default 4 (always 1 in memory)
	BusyTimeout time.Duration // default 10s
	Now         func() time.Time
}

// Open opens (creating and migrating) the database at path, or an
// in-memory database for Memory.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite: database path is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 4
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = 10 * time.Second
	}
	mem := path == Memory
	if !mem {
		if err := prepareFile(path); err != nil {
			return nil, err
		}
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", opts.BusyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	if !mem {
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(NORMAL)")
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite database %q: %w", path, err)
	}
	if mem {
		// Every connection to :memory: is a separate database: keep exactly one, forever.
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
	} else {
		db.SetMaxOpenConns(opts.MaxConns)
		db.SetMaxIdleConns(opts.MaxConns)
	}
	adb := &sqlDB{db: db}
	migs, err := migrations()
	if err != nil {
		_ = db.Close() // the setup error is the one to report
		return nil, err
	}
	if err := sqlstore.Migrate(ctx, adb, migs, ""); err != nil {
		_ = db.Close() // the setup error is the one to report
		return nil, fmt.Errorf("sqlite database %q: %w", path, err)
	}
	if !mem {
		if err := chmodFiles(path); err != nil {
			_ = db.Close() // the setup error is the one to report
			return nil, err
		}
	}
	s := &Store{
		Store: sqlstore.New(adb, Dialect{}, sqlstore.Options{Logger: opts.Logger.With("component", "store/sqlite"), Now: opts.Now}),
		path:  path,
	}
	return s, nil
}

func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.LoadMigrations(migrationFS, "migrations")
}

// Path returns the database path (Memory for in-memory databases).
func (s *Store) Path() string { return s.path }

// prepareFile creates the parent directory (0700) and the file (0600)
// before SQLite touches them, so the data is never group/world readable.
func prepareFile(path string) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("sqlite database %q: create directory: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite database %q: cannot open for writing: %w", path, err)
	}
	return f.Close()
}

// chmodFiles makes the database and its sidecars 0600.
func chmodFiles(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sqlite database %q: chmod: %w", p, err)
		}
	}
	return nil
}

// Dialect is the SQLite dialect.
type Dialect struct{}

var _ sqlstore.Dialect = Dialect{}

func (Dialect) Name() string                                                      { return "sqlite" }
func (Dialect) Placeholder(int) string                                            { return "?" }
func (Dialect) JSONParam(ph string) string                                        { return ph }
func (Dialect) JSONText(col string) string                                        { return col }
func (Dialect) ForUpdate() string                                                 { return "" }
func (Dialect) LockScope(context.Context, sqlstore.Querier, string, string) error { return nil }

// LabelMatch filters with json_extract per pair; keys are validated label
// keys (no quotes), bound as JSON paths.
func (Dialect) LabelMatch(sel map[string]string, bind func(any) string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = "json_extract(labels, " + bind(`$."`+k+`"`) + ") = " + bind(sel[k])
	}
	return "(" + strings.Join(parts, " AND ") + ")"
}

// UniqueViolation classifies SQLite constraint errors by the columns they
// name.
func (Dialect) UniqueViolation(err error) (string, bool) {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return "", false
	}
	if se.Code() != sqlite3.SQLITE_CONSTRAINT_UNIQUE && se.Code() != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
		return "", false
	}
	msg := se.Error()
	switch {
	case strings.Contains(msg, "objects.name"):
		return "name", true
	case strings.Contains(msg, "objects.version"):
		return "version", true
	case strings.Contains(msg, "objects.dedup_key"):
		return "dedup", true
	case strings.Contains(msg, "objects.id"):
		return "primary", true
	}
	return "unknown", true
}

// Unavailable reports a database locked past the busy timeout.
func (Dialect) Unavailable(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		c := se.Code() & 0xff
		return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
	}
	return false
}

// sqlDB adapts *sql.DB to sqlstore.DB. Its statements are prepared
// once (stmts) and reused on every connection and in transactions.
type sqlDB struct {
	db    *sql.DB
	stmts stmtCache
}

// stmtCache holds a prepared statement per query text: SQLite compiles
// a statement in about as long as it takes to run one of the store's
// point queries, and the store runs a small fixed set of them (the
// PostgreSQL backend gets the same from pgx's statement cache). Past
// maxCachedStmts texts (queries built with a variable number of
// arguments) statements are prepared per call, as database/sql does.
type stmtCache struct {
	mu sync.RWMutex
	m  map[string]*sql.Stmt
}

// maxCachedStmts bounds stmtCache.
const maxCachedStmts = 256

// lookup returns the statement of q, or nil when it is not prepared.
func (c *stmtCache) lookup(q string) *sql.Stmt {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[q]
}

// get returns the statement of q, preparing it on first use; nil when
// it cannot be kept (the cache is full or preparing failed: the caller
// runs q unprepared, and so gets its error as before). Preparing takes a
// connection of db's pool: never call it while holding one.
func (c *stmtCache) get(ctx context.Context, db *sql.DB, q string) *sql.Stmt {
	c.mu.RLock()
	st, ok := c.m[q]
	n := len(c.m)
	c.mu.RUnlock()
	if ok || n >= maxCachedStmts {
		return st
	}
	st, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.m[q]; ok {
		_ = st.Close() // prepared twice concurrently: keep the first
		return cur
	}
	if len(c.m) >= maxCachedStmts {
		_ = st.Close()
		return nil
	}
	if c.m == nil {
		c.m = map[string]*sql.Stmt{}
	}
	c.m[q] = st
	return st
}

// close closes every statement.
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		_ = st.Close()
	}
	c.m = nil
}

type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// stmtExecer is a prepared statement as an execer of its own query.
type stmtExecer struct{ st *sql.Stmt }

func (s stmtExecer) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return s.st.ExecContext(ctx, args...)
}
func (s stmtExecer) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return s.st.QueryRowContext(ctx, args...)
}
func (s stmtExecer) QueryContext(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
	return s.st.QueryContext(ctx, args...)
}

// on returns what runs q: its prepared statement, or db itself.
func (d *sqlDB) on(ctx context.Context, q string) execer {
	if st := d.stmts.get(ctx, d.db, q); st != nil {
		return stmtExecer{st}
	}
	return d.db
}

func exec(ctx context.Context, e execer, q string, args ...any) (int64, error) {
	res, err := e.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

type rows struct{ *sql.Rows }

func (r rows) Close() { _ = r.Rows.Close() }

func query(ctx context.Context, e execer, q string, args ...any) (sqlstore.Rows, error) {
	rs, err := e.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return rows{rs}, nil
}

func (d *sqlDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return exec(ctx, d.on(ctx, q), q, args...)
}
func (d *sqlDB) QueryRow(ctx context.Context, q string, args ...any) sqlstore.Row {
	return row{d.on(ctx, q).QueryRowContext(ctx, q, args...)}
}
func (d *sqlDB) Query(ctx context.Context, q string, args ...any) (sqlstore.Rows, error) {
	return query(ctx, d.on(ctx, q), q, args...)
}
func (d *sqlDB) Begin(ctx context.Context) (sqlstore.Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &sqlTx{tx: tx, d: d}, nil
}
func (d *sqlDB) Close() error {
	d.stmts.close()
	return d.db.Close()
}

// SQL returns the *sql.DB (benchmarks run raw statements on it).
func (s *Store) SQL() *sql.DB { return s.DB().(*sqlDB).db }

type sqlTx struct {
	tx     *sql.Tx
	d      *sqlDB
	missed []string // queries run unprepared, prepared once the transaction ends
}

// on returns what runs q in the transaction: its prepared statement
// (prepared on the transaction's connection when it is not yet), or the
// transaction itself for a query not prepared yet: preparing it would
// take a second connection while this one is held (the pool may have no
// other), so it is prepared after the transaction ends.
func (t *sqlTx) on(ctx context.Context, q string) execer {
	if st := t.d.stmts.lookup(q); st != nil {
		return stmtExecer{t.tx.StmtContext(ctx, st)}
	}
	t.missed = append(t.missed, q)
	return t.tx
}

// prepareMissed prepares the queries the transaction ran unprepared.
func (t *sqlTx) prepareMissed(ctx context.Context) {
	for _, q := range t.missed {
		t.d.stmts.get(ctx, t.d.db, q)
	}
	t.missed = nil
}

func (t *sqlTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return exec(ctx, t.on(ctx, q), q, args...)
}
func (t *sqlTx) QueryRow(ctx context.Context, q string, args ...any) sqlstore.Row {
	return row{t.on(ctx, q).QueryRowContext(ctx, q, args...)}
}
func (t *sqlTx) Query(ctx context.Context, q string, args ...any) (sqlstore.Rows, error) {
	return query(ctx, t.on(ctx, q), q, args...)
}
func (t *sqlTx) Commit(ctx context.Context) error {
	err := t.tx.Commit()
	t.prepareMissed(ctx)
	return err
}
func (t *sqlTx) Rollback(ctx context.Context) error {
	err := t.tx.Rollback()
	t.prepareMissed(ctx)
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
