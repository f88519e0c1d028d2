package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/storetesting"
)

// Options tune a Store.
type Options struct {
	Logger *slog.Logger
	// Now is the clock for timestamps and lease expiry (default time.Now).
	Now func() time.Time
}

// Store implements store.Store over a DB and a Dialect.
type Store struct {
	db  DB
	d   Dialect
	log *slog.Logger
	now func() time.Time

	unavailable unavailableLog
}

var _ store.Store = (*Store)(nil)

// New returns a Store over an already migrated db.
func New(db DB, d Dialect, opts Options) *Store {
	s := &Store{db: db, d: d, log: opts.Logger, now: opts.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// DB returns the underlying pool (benchmarks compare against raw SQL on it).
func (s *Store) DB() DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.d }

// Close closes the pool.
func (s *Store) Close() error { return s.db.Close() }

// binder collects bind arguments and renders placeholders.
type binder struct {
	d    Dialect
	args []any
}

func (b *binder) arg(v any) string {
	b.args = append(b.args, v)
	return b.d.Placeholder(len(b.args))
}

func (s *Store) bind() *binder { return &binder{d: s.d} }

func nullStr(v string) any {
	if v == "" {
		return nil
	}
	return v
}

func nullInt(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// dbErr classifies an unexpected database error.
func (s *Store) dbErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if s.d.Unavailable(err) {
		// The driver's text names the user, database and address: it
		// goes to the log, never to callers.
		s.unavailable.log(s.log, s.now(), op, s.d.Name(), err)
		return ErrDatabaseUnavailable
	}
	return fmt.Errorf("%s: %w", op, err)
}

// ErrDatabaseUnavailable is what every call returns while the database
// cannot be reached: errdefs.ErrUnavailable "database unavailable", with
// no connection details (they are logged, at most once per
// unavailableLogEvery).
var ErrDatabaseUnavailable = errdefs.Unavailable("database unavailable")

// unavailableLogEvery bounds the "database unavailable" log lines during
// an outage.
const unavailableLogEvery = 5 * time.Second

// unavailableLog rate-limits the log lines of an outage.
type unavailableLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (u *unavailableLog) log(log *slog.Logger, now time.Time, op, db string, err error) {
	u.mu.Lock()
	if !u.last.IsZero() && now.Sub(u.last) < unavailableLogEvery {
		u.suppressed++
		u.mu.Unlock()
		return
	}
	n := u.suppressed
	u.last, u.suppressed = now, 0
	u.mu.Unlock()
	log.Warn("database unavailable", "database", db, "op", op, "err", err, "suppressed_since_last", n)
}

// Ping checks that the database answers; errors are classified as for
// every other call (ErrDatabaseUnavailable while it cannot be reached).
func (s *Store) Ping(ctx context.Context) error {
	var one int64
	return s.dbErr("ping", s.db.QueryRow(ctx, "SELECT 1").Scan(&one))
}

func labelsJSON(l map[string]string) (string, error) {
	if l == nil {
		l = map[string]string{}
	}
	b, err := json.Marshal(l)
	return string(b), err
}

func (s *Store) alreadyExists(err error, objType string, m store.Meta) error {
	idx, ok := s.d.UniqueViolation(err)
	if !ok {
		return nil
	}
	switch idx {
	case "name":
		return errdefs.AlreadyExists(fmt.Sprintf("%s %q already exists in workspace %q", objType, m.Name, m.Workspace))
	case "primary":
		return errdefs.AlreadyExists(fmt.Sprintf("%s with id %q already exists", objType, m.ID))
	default:
		return errdefs.AlreadyExists(fmt.Sprintf("%s %q already exists", objType, m.ID))
	}
}

// Create implements store.Store (MustCreate).
func (s *Store) Create(ctx context.Context, objType string, msg proto.Message) (store.WriteResult, error) {
	if err := store.ValidateType(objType); err != nil {
		return store.WriteResult{}, err
	}
	m, err := store.GetMeta(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	if err := store.ValidateLabels(m.Labels); err != nil {
		return store.WriteResult{}, err
	}
	if m.ID == "" {
		m.ID = uuid.NewString()
		if err := store.SetID(msg, m.ID); err != nil {
			return store.WriteResult{}, err
		}
	}
	now := s.now().UnixMilli()
	if m.CreatedAtMs == 0 {
		m.CreatedAtMs = now
		if err := store.SetCreatedAtMs(msg, now); err != nil {
			return store.WriteResult{}, err
		}
	}
	prevRV := m.ResourceVersion
	if err := store.SetResourceVersion(msg, 1); err != nil {
		return store.WriteResult{}, err
	}
	payload, err := proto.Marshal(msg)
	if err != nil {
		return store.WriteResult{}, fmt.Errorf("encode %s: %w", objType, err)
	}
	lj, err := labelsJSON(m.Labels)
	if err != nil {
		return store.WriteResult{}, err
	}
	b := s.bind()
	q := `INSERT INTO objects (id, object_type, workspace, name, labels, resource_version, payload, created_at_ms, updated_at_ms) VALUES (` +
		b.arg(m.ID) + `, ` + b.arg(objType) + `, ` + b.arg(m.Workspace) + `, ` + b.arg(nullStr(m.Name)) + `, ` +
		s.d.JSONParam(b.arg(lj)) + `, 1, ` + b.arg(payload) + `, ` + b.arg(m.CreatedAtMs) + `, ` + b.arg(now) + `)`
	if _, err := s.db.Exec(ctx, q, b.args...); err != nil {
		_ = store.SetResourceVersion(msg, prevRV)
		if ae := s.alreadyExists(err, objType, m); ae != nil {
			return store.WriteResult{}, ae
		}
		return store.WriteResult{}, s.dbErr("create "+objType, err)
	}
	return store.WriteResult{ResourceVersion: 1, CreatedAtMs: m.CreatedAtMs, UpdatedAtMs: now}, nil
}

// Update implements store.Store (MatchResourceVersion).
func (s *Store) Update(ctx context.Context, objType string, msg proto.Message, expectedRV uint64) (store.WriteResult, error) {
	return s.update(ctx, s.db, objType, msg, expectedRV)
}

func (s *Store) update(ctx context.Context, q Querier, objType string, msg proto.Message, expectedRV uint64) (store.WriteResult, error) {
	if err := store.ValidateType(objType); err != nil {
		return store.WriteResult{}, err
	}
	m, err := store.GetMeta(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	if m.ID == "" {
		return store.WriteResult{}, errdefs.InvalidArgument(objType + " id is required")
	}
	if expectedRV == 0 {
		expectedRV = m.ResourceVersion
	}
	if expectedRV == 0 {
		return store.WriteResult{}, errdefs.InvalidArgument(fmt.Sprintf("%s %q: resource version is required for an update", objType, m.ID))
	}
	if err := store.ValidateLabels(m.Labels); err != nil {
		return store.WriteResult{}, err
	}
	if err := store.SetResourceVersion(msg, expectedRV+1); err != nil {
		return store.WriteResult{}, err
	}
	payload, err := proto.Marshal(msg)
	if err != nil {
		_ = store.SetResourceVersion(msg, m.ResourceVersion)
		return store.WriteResult{}, fmt.Errorf("encode %s: %w", objType, err)
	}
	lj, err := labelsJSON(m.Labels)
	if err != nil {
		return store.WriteResult{}, err
	}
	now := s.now().UnixMilli()
	b := s.bind()
	sqlText := `UPDATE objects SET workspace = ` + b.arg(m.Workspace) + `, name = ` + b.arg(nullStr(m.Name)) +
		`, labels = ` + s.d.JSONParam(b.arg(lj)) + `, payload = ` + b.arg(payload) + `, updated_at_ms = ` + b.arg(now) +
		`, resource_version = resource_version + 1 WHERE object_type = ` + b.arg(objType) + ` AND id = ` + b.arg(m.ID) +
		` AND resource_version = ` + b.arg(int64(expectedRV)) + ` RETURNING resource_version, created_at_ms`
	var rv, created int64
	err = q.QueryRow(ctx, sqlText, b.args...).Scan(&rv, &created)
	if err != nil {
		_ = store.SetResourceVersion(msg, m.ResourceVersion)
		if errors.Is(err, ErrNoRows) {
			return store.WriteResult{}, s.conflict(ctx, q, objType, m.ID, expectedRV)
		}
		if ae := s.alreadyExists(err, objType, m); ae != nil {
			return store.WriteResult{}, ae
		}
		return store.WriteResult{}, s.dbErr("update "+objType, err)
	}
	return store.WriteResult{ResourceVersion: uint64(rv), CreatedAtMs: created, UpdatedAtMs: now}, nil
}

// conflict builds the ConflictError for a failed CAS on (objType, id).
func (s *Store) conflict(ctx context.Context, q Querier, objType, id string, expected uint64) error {
	b := s.bind()
	var cur int64
	err := q.QueryRow(ctx, `SELECT resource_version FROM objects WHERE object_type = `+b.arg(objType)+` AND id = `+b.arg(id), b.args...).Scan(&cur)
	switch {
	case errors.Is(err, ErrNoRows):
		return &store.ConflictError{Type: objType, ID: id, Expected: expected, Gone: true}
	case err != nil:
		return s.dbErr("read "+objType, err)
	}
	return &store.ConflictError{Type: objType, ID: id, Expected: expected, Current: uint64(cur)}
}

// UpdateCAS implements store.Store.
func (s *Store) UpdateCAS(ctx context.Context, objType, id string, expectedRV uint64, msg proto.Message, mutate func(proto.Message) error) (store.WriteResult, error) {
	if err := s.Get(ctx, objType, id, msg); err != nil {
		return store.WriteResult{}, err
	}
	return s.mutateAndWrite(ctx, s.db, objType, id, expectedRV, msg, mutate)
}

// mutateAndWrite applies mutate to msg (already read) and writes it back
// conditioned on the version read.
func (s *Store) mutateAndWrite(ctx context.Context, q Querier, objType, id string, expectedRV uint64, msg proto.Message, mutate func(proto.Message) error) (store.WriteResult, error) {
	before, err := store.GetMeta(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	if expectedRV != 0 && before.ResourceVersion != expectedRV {
		return store.WriteResult{}, &store.ConflictError{Type: objType, ID: id, Expected: expectedRV, Current: before.ResourceVersion}
	}
	if mutate != nil {
		if err := mutate(msg); err != nil {
			return store.WriteResult{}, err
		}
	}
	after, err := store.GetMeta(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	switch {
	case after.ID != before.ID:
		return store.WriteResult{}, errdefs.InvalidArgument(fmt.Sprintf("%s %q: id cannot be changed", objType, id))
	case after.Name != before.Name:
		return store.WriteResult{}, errdefs.InvalidArgument(fmt.Sprintf("%s %q: name cannot be changed", objType, before.Name))
	case after.Workspace != before.Workspace:
		return store.WriteResult{}, errdefs.InvalidArgument(fmt.Sprintf("%s %q: workspace cannot be changed", objType, before.Name))
	}
	return s.update(ctx, q, objType, msg, before.ResourceVersion)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, objType, id string, msg proto.Message) error {
	return s.get(ctx, s.db, objType, id, msg, "")
}

func (s *Store) get(ctx context.Context, q Querier, objType, id string, msg proto.Message, suffix string) error {
	if err := store.ValidateType(objType); err != nil {
		return err
	}
	b := s.bind()
	var payload []byte
	var rv int64
	err := q.QueryRow(ctx, `SELECT payload, resource_version FROM objects WHERE object_type = `+b.arg(objType)+` AND id = `+b.arg(id)+suffix, b.args...).Scan(&payload, &rv)
	if errors.Is(err, ErrNoRows) {
		return errdefs.NotFound(fmt.Sprintf("%s %q not found", objType, id))
	}
	if err != nil {
		return s.dbErr("get "+objType, err)
	}
	return store.Hydrate(payload, uint64(rv), msg)
}

// GetByName implements store.Store.
func (s *Store) GetByName(ctx context.Context, objType, workspace, name string, msg proto.Message) error {
	if err := store.ValidateType(objType); err != nil {
		return err
	}
	b := s.bind()
	var payload []byte
	var rv int64
	err := s.db.QueryRow(ctx, `SELECT payload, resource_version FROM objects WHERE object_type = `+b.arg(objType)+
		` AND workspace = `+b.arg(workspace)+` AND name = `+b.arg(name), b.args...).Scan(&payload, &rv)
	if errors.Is(err, ErrNoRows) {
		return errdefs.NotFound(fmt.Sprintf("%s %q not found in workspace %q", objType, name, workspace))
	}
	if err != nil {
		return s.dbErr("get "+objType, err)
	}
	return store.Hydrate(payload, uint64(rv), msg)
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, objType string, opts store.ListOptions) ([]store.Object, error) {
	if err := store.ValidateType(objType); err != nil {
		return nil, err
	}
	if opts.Offset < 0 {
		return nil, errdefs.InvalidArgument("offset must not be negative")
	}
	sel, err := store.ParseLabelSelector(opts.LabelSelector)
	if err != nil {
		return nil, err
	}
	b := s.bind()
	var w strings.Builder
	w.WriteString(`SELECT id, workspace, name, ` + s.d.JSONText("labels") + `, resource_version, created_at_ms, updated_at_ms, payload FROM objects WHERE object_type = ` + b.arg(objType))
	if !opts.AllWorkspaces {
		w.WriteString(` AND workspace = ` + b.arg(opts.Workspace))
	}
	if len(sel) > 0 {
		w.WriteString(` AND ` + s.d.LabelMatch(sel, b.arg))
	}
	w.WriteString(` ORDER BY created_at_ms, COALESCE(name, ''), id LIMIT ` + b.arg(int64(store.Limit(opts.Limit))) + ` OFFSET ` + b.arg(int64(opts.Offset)))
	rows, err := s.db.Query(ctx, w.String(), b.args...)
	if err != nil {
		return nil, s.dbErr("list "+objType, err)
	}
	defer rows.Close()
	var out []store.Object
	for rows.Next() {
		o := store.Object{Type: objType}
		var name, labels sql.NullString
		var rv int64
		if err := rows.Scan(&o.ID, &o.Workspace, &name, &labels, &rv, &o.CreatedAtMs, &o.UpdatedAtMs, &o.Payload); err != nil {
			return nil, s.dbErr("list "+objType, err)
		}
		o.Name, o.ResourceVersion = name.String, uint64(rv)
		o.Labels = map[string]string{}
		if labels.Valid && labels.String != "" {
			if err := json.Unmarshal([]byte(labels.String), &o.Labels); err != nil {
				return nil, fmt.Errorf("list %s: labels of %q: %w", objType, o.ID, err)
			}
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, s.dbErr("list "+objType, err)
	}
	return out, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, objType, id string) (bool, error) {
	if err := store.ValidateType(objType); err != nil {
		return false, err
	}
	var n int64
	err := s.deleteObject(ctx, objType, id, func(q Querier) error {
		b := s.bind()
		var err error
		n, err = q.Exec(ctx, `DELETE FROM objects WHERE object_type = `+b.arg(objType)+` AND id = `+b.arg(id), b.args...)
		if err != nil {
			return s.dbErr("delete "+objType, err)
		}
		return nil
	})
	return n > 0, err
}

// DeleteIf implements store.Store.
func (s *Store) DeleteIf(ctx context.Context, objType, id string, expectedRV uint64) error {
	if err := store.ValidateType(objType); err != nil {
		return err
	}
	return s.deleteObject(ctx, objType, id, func(q Querier) error {
		b := s.bind()
		n, err := q.Exec(ctx, `DELETE FROM objects WHERE object_type = `+b.arg(objType)+` AND id = `+b.arg(id)+
			` AND resource_version = `+b.arg(int64(expectedRV)), b.args...)
		if err != nil {
			return s.dbErr("delete "+objType, err)
		}
		if n > 0 {
			return nil
		}
		err = s.conflict(ctx, q, objType, id, expectedRV)
		if ce, ok := errors.AsType[*store.ConflictError](err); ok && ce.Gone {
			return errdefs.NotFound(fmt.Sprintf("%s %q not found", objType, id))
		}
		return err
	})
}

// deleteObject runs del, the statement removing object id, and removes the
// records the object owns in the same transaction. The object's row goes
// first: in PostgreSQL its row lock makes a concurrent owned-record insert
// (which locks the owner, see lockOwner) either finish before the records
// are deleted or find the owner gone.
func (s *Store) deleteObject(ctx context.Context, objType, id string, del func(Querier) error) error {
	owned := store.OwnedRecordTypes(objType)
	if len(owned) == 0 {
		return del(s.db)
	}
	return s.inTx(ctx, "delete "+objType, func(tx Tx) error {
		if err := del(tx); err != nil {
			return err
		}
		b := s.bind()
		ph := make([]string, len(owned))
		for i, t := range owned {
			ph[i] = b.arg(t)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM objects WHERE object_type IN (`+strings.Join(ph, ", ")+`) AND scope = `+b.arg(id), b.args...); err != nil {
			return s.dbErr("delete records of "+objType, err)
		}
		return nil
	})
}

// lockOwner locks, inside tx, the object that owns records of recType in
// scope (see store.ScopeOwner); a missing owner is NotFound. Record types
// without an owner need nothing.
func (s *Store) lockOwner(ctx context.Context, tx Querier, recType, scope string) error {
	owner, ok := store.ScopeOwner(recType)
	if !ok {
		return nil
	}
	b := s.bind()
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM objects WHERE object_type = `+b.arg(owner)+` AND id = `+b.arg(scope)+s.d.ForUpdate(), b.args...).Scan(&id)
	switch {
	case errors.Is(err, ErrNoRows):
		return errdefs.NotFound(fmt.Sprintf("%s %q not found", owner, scope))
	case err != nil:
		return s.dbErr("lock "+owner, err)
	}
	return nil
}

// DeleteByScope implements store.Store.
func (s *Store) DeleteByScope(ctx context.Context, objType, scope string) (int64, error) {
	if err := store.ValidateType(objType); err != nil {
		return 0, err
	}
	b := s.bind()
	n, err := s.db.Exec(ctx, `DELETE FROM objects WHERE object_type = `+b.arg(objType)+` AND scope = `+b.arg(scope), b.args...)
	if err != nil {
		return 0, s.dbErr("delete "+objType, err)
	}
	return n, nil
}

// PutUnconditional inserts or overwrites msg by id. It is reachable only
// through package storetesting, for tests.
func (s *Store) PutUnconditional(ctx context.Context, k storetesting.Key, objType string, msg proto.Message) (store.WriteResult, error) {
	if !storetesting.Valid(k) {
		return store.WriteResult{}, errdefs.PermissionDenied("unconditional writes are for tests only")
	}
	m, err := store.GetMeta(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	if m.ID == "" {
		return store.WriteResult{}, errdefs.InvalidArgument("id is required")
	}
	payload, err := proto.Marshal(msg)
	if err != nil {
		return store.WriteResult{}, err
	}
	lj, err := labelsJSON(m.Labels)
	if err != nil {
		return store.WriteResult{}, err
	}
	now := s.now().UnixMilli()
	created := m.CreatedAtMs
	if created == 0 {
		created = now
	}
	b := s.bind()
	q := `INSERT INTO objects (id, object_type, workspace, name, labels, resource_version, payload, created_at_ms, updated_at_ms) VALUES (` +
		b.arg(m.ID) + `, ` + b.arg(objType) + `, ` + b.arg(m.Workspace) + `, ` + b.arg(nullStr(m.Name)) + `, ` +
		s.d.JSONParam(b.arg(lj)) + `, 1, ` + b.arg(payload) + `, ` + b.arg(created) + `, ` + b.arg(now) + `)` +
		` ON CONFLICT (id) DO UPDATE SET object_type = excluded.object_type, workspace = excluded.workspace, name = excluded.name,` +
		` labels = excluded.labels, payload = excluded.payload, updated_at_ms = excluded.updated_at_ms,` +
		` resource_version = objects.resource_version + 1 RETURNING resource_version, created_at_ms`
	var rv, c int64
	if err := s.db.QueryRow(ctx, q, b.args...).Scan(&rv, &c); err != nil {
		if ae := s.alreadyExists(err, objType, m); ae != nil {
			return store.WriteResult{}, ae
		}
		return store.WriteResult{}, s.dbErr("put "+objType, err)
	}
	return store.WriteResult{ResourceVersion: uint64(rv), CreatedAtMs: c, UpdatedAtMs: now}, nil
}

// ---- leases ----

func leaseID(name string) string { return store.TypeReconcilerLease + "/" + name }

func leasePayload(holder string, exp int64) ([]byte, error) {
	st, err := structpb.NewStruct(map[string]any{"holder": holder, "expires_at_ms": float64(exp)})
	if err != nil {
		return nil, err
	}
	return proto.Marshal(st)
}

func decodeLease(name string, payload []byte, rv int64) (store.Lease, error) {
	var st structpb.Struct
	if err := proto.Unmarshal(payload, &st); err != nil {
		return store.Lease{}, fmt.Errorf("decode lease %q: %w", name, err)
	}
	f := st.GetFields()
	return store.Lease{
		Name:            name,
		Holder:          f["holder"].GetStringValue(),
		ExpiresAtMs:     int64(f["expires_at_ms"].GetNumberValue()),
		ResourceVersion: uint64(rv),
	}, nil
}

// AcquireLease implements store.Store.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return store.Lease{}, errdefs.InvalidArgument("lease name, holder and a positive ttl are required")
	}
	now := s.now()
	exp := now.Add(ttl).UnixMilli()
	payload, err := leasePayload(holder, exp)
	if err != nil {
		return store.Lease{}, err
	}
	id := leaseID(name)
	b := s.bind()
	var cur []byte
	var rv int64
	err = s.db.QueryRow(ctx, `SELECT payload, resource_version FROM objects WHERE object_type = `+b.arg(store.TypeReconcilerLease)+` AND id = `+b.arg(id), b.args...).Scan(&cur, &rv)
	switch {
	case errors.Is(err, ErrNoRows):
		b := s.bind()
		q := `INSERT INTO objects (id, object_type, workspace, name, labels, resource_version, payload, created_at_ms, updated_at_ms) VALUES (` +
			b.arg(id) + `, ` + b.arg(store.TypeReconcilerLease) + `, '', ` + b.arg(name) + `, ` + s.d.JSONParam(b.arg("{}")) + `, 1, ` +
			b.arg(payload) + `, ` + b.arg(now.UnixMilli()) + `, ` + b.arg(now.UnixMilli()) + `)`
		if _, err := s.db.Exec(ctx, q, b.args...); err != nil {
			if _, ok := s.d.UniqueViolation(err); ok {
				return store.Lease{}, &store.ConflictError{Type: store.TypeReconcilerLease, ID: name, Current: 1}
			}
			return store.Lease{}, s.dbErr("acquire lease", err)
		}
		return store.Lease{Name: name, Holder: holder, ExpiresAtMs: exp, ResourceVersion: 1}, nil
	case err != nil:
		return store.Lease{}, s.dbErr("acquire lease", err)
	}
	l, err := decodeLease(name, cur, rv)
	if err != nil {
		return store.Lease{}, err
	}
	if l.Holder != holder && !l.Expired(now) {
		return store.Lease{}, &store.LeaseHeldError{Lease: l}
	}
	return s.writeLease(ctx, l, holder, exp, payload)
}

func (s *Store) writeLease(ctx context.Context, l store.Lease, holder string, exp int64, payload []byte) (store.Lease, error) {
	b := s.bind()
	q := `UPDATE objects SET payload = ` + b.arg(payload) + `, updated_at_ms = ` + b.arg(s.now().UnixMilli()) +
		`, resource_version = resource_version + 1 WHERE object_type = ` + b.arg(store.TypeReconcilerLease) +
		` AND id = ` + b.arg(leaseID(l.Name)) + ` AND resource_version = ` + b.arg(int64(l.ResourceVersion)) + ` RETURNING resource_version`
	var rv int64
	if err := s.db.QueryRow(ctx, q, b.args...).Scan(&rv); err != nil {
		if errors.Is(err, ErrNoRows) {
			err := s.conflict(ctx, s.db, store.TypeReconcilerLease, leaseID(l.Name), l.ResourceVersion)
			if ce, ok := errors.AsType[*store.ConflictError](err); ok {
				ce.ID = l.Name
			}
			return store.Lease{}, err
		}
		return store.Lease{}, s.dbErr("write lease", err)
	}
	return store.Lease{Name: l.Name, Holder: holder, ExpiresAtMs: exp, ResourceVersion: uint64(rv)}, nil
}

// RenewLease implements store.Store.
func (s *Store) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if l.Name == "" || l.Holder == "" || ttl <= 0 {
		return store.Lease{}, errdefs.InvalidArgument("lease name, holder and a positive ttl are required")
	}
	exp := s.now().Add(ttl).UnixMilli()
	payload, err := leasePayload(l.Holder, exp)
	if err != nil {
		return store.Lease{}, err
	}
	return s.writeLease(ctx, l, l.Holder, exp, payload)
}

// ReleaseLease implements store.Store.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	err := s.DeleteIf(ctx, store.TypeReconcilerLease, leaseID(l.Name), l.ResourceVersion)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if ce, ok := errors.AsType[*store.ConflictError](err); ok {
		ce.ID = l.Name
	}
	return err
}
