// Package postgres is the PostgreSQL backend of store.Store (pgx/v5
// pgxpool). Several gateway replicas may share one database: writes are
// compare-and-swap on resource_version, scoped versions are serialized by
// transaction-scoped advisory locks, and migrations by an advisory lock.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock serializes migrators across replicas.
const migrationLock = `SELECT pg_advisory_xact_lock(7020421100)`

// Store is a PostgreSQL-backed store.Store.
type Store struct {
	*sqlstore.Store
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Options tune Open.
type Options struct {
	Logger   *slog.Logger
	MaxConns int32 // default: pgxpool's default (or pool_max_conns in the URL)
	Now      func() time.Time
}

// Open connects to url (postgres://...), checks the connection and
// applies migrations. A server that cannot be reached is an
// errdefs.ErrUnavailable error naming host:port and the driver's reason;
// the password never appears in errors.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errdefs.InvalidArgument("invalid postgres url: " + redact(err.Error(), url))
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	password := cfg.ConnConfig.Password
	addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, unavailable(addr, err, password)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, unavailable(addr, err, password)
	}
	adb := &pgDB{pool: pool}
	migs, err := sqlstore.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := sqlstore.Migrate(ctx, adb, migs, migrationLock); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres %s: %s", addr, redact(err.Error(), password))
	}
	return &Store{
		Store: sqlstore.New(adb, Dialect{}, sqlstore.Options{Logger: opts.Logger.With("component", "store/postgres"), Now: opts.Now}),
		pool:  pool,
	}, nil
}

// Pool returns the connection pool (benchmarks run raw statements on it).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

func unavailable(addr string, err error, password string) error {
	reason := err
	for {
		u := errors.Unwrap(reason)
		if u == nil {
			break
		}
		reason = u
	}
	msg := fmt.Sprintf("cannot connect to postgres at %s: %s", addr, reason.Error())
	return errdefs.Unavailable(redact(msg, password))
}

func redact(msg, secret string) string {
	if secret == "" {
		return msg
	}
	return strings.ReplaceAll(msg, secret, "xxxxx")
}

// Dialect is the PostgreSQL dialect.
type Dialect struct{}

var _ sqlstore.Dialect = Dialect{}

func (Dialect) Name() string               { return "postgres" }
func (Dialect) Placeholder(n int) string   { return "$" + strconv.Itoa(n) }
func (Dialect) JSONParam(ph string) string { return ph + "::jsonb" }
func (Dialect) JSONText(col string) string { return col + "::text" }
func (Dialect) ForUpdate() string          { return " FOR UPDATE" }

// LabelMatch uses jsonb containment, served by the GIN index.
func (Dialect) LabelMatch(sel map[string]string, bind func(any) string) string {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for k, v := range sel {
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Quote(k))
		b.WriteByte(':')
		b.WriteString(strconv.Quote(v))
	}
	b.WriteByte('}')
	return "labels @> " + bind(b.String()) + "::jsonb"
}

// LockScope takes a transaction-scoped advisory lock on (objType, scope).
func (Dialect) LockScope(ctx context.Context, tx sqlstore.Querier, objType, scope string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, objType+"/"+scope)
	return err
}

// UniqueViolation classifies by constraint name.
func (Dialect) UniqueViolation(err error) (string, bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		return "", false
	}
	switch pe.ConstraintName {
	case "objects_pkey":
		return "primary", true
	case "objects_name_uq":
		return "name", true
	case "objects_version_uq":
		return "version", true
	case "objects_dedup_uq":
		return "dedup", true
	}
	return "unknown", true
}

// Unavailable reports connection-level failures.
func (Dialect) Unavailable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.SafeToRetry(err)
}

// pgDB adapts pgxpool to sqlstore.DB.
type pgDB struct{ pool *pgxpool.Pool }

type pgQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type pgRow struct{ r pgx.Row }

func (r pgRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

func pgExec(ctx context.Context, q pgQuerier, sql string, args ...any) (int64, error) {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func pgQuery(ctx context.Context, q pgQuerier, sql string, args ...any) (sqlstore.Rows, error) {
	rs, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

func (d *pgDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return pgExec(ctx, d.pool, q, args...)
}
func (d *pgDB) QueryRow(ctx context.Context, q string, args ...any) sqlstore.Row {
	return pgRow{d.pool.QueryRow(ctx, q, args...)}
}
func (d *pgDB) Query(ctx context.Context, q string, args ...any) (sqlstore.Rows, error) {
	return pgQuery(ctx, d.pool, q, args...)
}
func (d *pgDB) Begin(ctx context.Context) (sqlstore.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{tx: tx}, nil
}
func (d *pgDB) Close() error { d.pool.Close(); return nil }

type pgTx struct{ tx pgx.Tx }

func (t *pgTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return pgExec(ctx, t.tx, q, args...)
}
func (t *pgTx) QueryRow(ctx context.Context, q string, args ...any) sqlstore.Row {
	return pgRow{t.tx.QueryRow(ctx, q, args...)}
}
func (t *pgTx) Query(ctx context.Context, q string, args ...any) (sqlstore.Rows, error) {
	return pgQuery(ctx, t.tx, q, args...)
}
func (t *pgTx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t *pgTx) Rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}
