package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

const recordCols = `id, scope, version, status, dedup_key, hit_count, payload, resource_version, created_at_ms, updated_at_ms`

func scanRecord(objType string, r interface{ Scan(...any) error }) (store.Record, error) {
	rec := store.Record{Type: objType}
	var scope, status, dedup sql.NullString
	var version sql.NullInt64
	var rv int64
	if err := r.Scan(&rec.ID, &scope, &version, &status, &dedup, &rec.HitCount, &rec.Payload, &rv, &rec.CreatedAtMs, &rec.UpdatedAtMs); err != nil {
		return store.Record{}, err
	}
	rec.Scope, rec.Version, rec.Status, rec.DedupKey, rec.ResourceVersion = scope.String, version.Int64, status.String, dedup.String, uint64(rv)
	return rec, nil
}

func validateRecord(rec store.Record) error {
	if err := store.ValidateType(rec.Type); err != nil {
		return err
	}
	if rec.Scope == "" {
		return errdefs.InvalidArgument(rec.Type + " scope is required")
	}
	return nil
}

// insertRecord inserts rec as given (Version already chosen).
func (s *Store) insertRecord(ctx context.Context, q Querier, rec *store.Record) error {
	if rec.ID == "" {
		rec.ID = uuid.NewString()
	}
	now := s.now().UnixMilli()
	rec.CreatedAtMs, rec.UpdatedAtMs, rec.ResourceVersion = now, now, 1
	b := s.bind()
	sqlText := `INSERT INTO objects (id, object_type, workspace, scope, version, status, dedup_key, hit_count, labels, resource_version, payload, created_at_ms, updated_at_ms) VALUES (` +
		b.arg(rec.ID) + `, ` + b.arg(rec.Type) + `, '', ` + b.arg(rec.Scope) + `, ` + b.arg(nullInt(rec.Version)) + `, ` +
		b.arg(nullStr(rec.Status)) + `, ` + b.arg(nullStr(rec.DedupKey)) + `, ` + b.arg(rec.HitCount) + `, ` + s.d.JSONParam(b.arg("{}")) +
		`, 1, ` + b.arg(nonNil(rec.Payload)) + `, ` + b.arg(now) + `, ` + b.arg(now) + `)`
	if _, err := q.Exec(ctx, sqlText, b.args...); err != nil {
		if idx, ok := s.d.UniqueViolation(err); ok {
			switch idx {
			case "version":
				return &store.ConflictError{Type: rec.Type, ID: fmt.Sprintf("%s@%d", rec.Scope, rec.Version), Current: uint64(rec.Version)}
			case "primary":
				return errdefs.AlreadyExists(fmt.Sprintf("%s with id %q already exists", rec.Type, rec.ID))
			default:
				return errdefs.AlreadyExists(fmt.Sprintf("%s %q already exists in scope %q", rec.Type, rec.DedupKey, rec.Scope))
			}
		}
		return s.dbErr("create "+rec.Type, err)
	}
	return nil
}

func (s *Store) nextVersion(ctx context.Context, q Querier, objType, scope string) (int64, error) {
	b := s.bind()
	var max sql.NullInt64
	if err := q.QueryRow(ctx, `SELECT MAX(version) FROM objects WHERE object_type = `+b.arg(objType)+` AND scope = `+b.arg(scope), b.args...).Scan(&max); err != nil {
		return 0, s.dbErr("next version", err)
	}
	return max.Int64 + 1, nil
}

// inTx runs fn in a write transaction and commits when it returns nil.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return s.dbErr(op, err)
	}
	if err := fn(tx); err != nil {
		if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil {
			s.log.WarnContext(ctx, "rollback failed", "op", op, "error", rbErr)
		}
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return s.dbErr(op+": commit", err)
	}
	return nil
}

// CreateScoped implements store.Store.
func (s *Store) CreateScoped(ctx context.Context, rec store.Record) (store.Record, error) {
	if err := validateRecord(rec); err != nil {
		return store.Record{}, err
	}
	err := s.inTx(ctx, "create "+rec.Type, func(tx Tx) error {
		if err := s.d.LockScope(ctx, tx, rec.Type, rec.Scope); err != nil {
			return s.dbErr("lock scope", err)
		}
		if err := s.lockOwner(ctx, tx, rec.Type, rec.Scope); err != nil {
			return err
		}
		v, err := s.nextVersion(ctx, tx, rec.Type, rec.Scope)
		if err != nil {
			return err
		}
		rec.Version = v
		return s.insertRecord(ctx, tx, &rec)
	})
	if err != nil {
		return store.Record{}, err
	}
	return rec, nil
}

// GetScoped implements store.Store.
func (s *Store) GetScoped(ctx context.Context, objType, id string) (store.Record, error) {
	if err := store.ValidateType(objType); err != nil {
		return store.Record{}, err
	}
	b := s.bind()
	rec, err := scanRecord(objType, s.db.QueryRow(ctx, `SELECT `+recordCols+` FROM objects WHERE object_type = `+b.arg(objType)+` AND id = `+b.arg(id), b.args...))
	if errors.Is(err, ErrNoRows) {
		return store.Record{}, errdefs.NotFound(fmt.Sprintf("%s %q not found", objType, id))
	}
	if err != nil {
		return store.Record{}, s.dbErr("get "+objType, err)
	}
	return rec, nil
}

// GetLatestScoped implements store.Store.
func (s *Store) GetLatestScoped(ctx context.Context, objType, scope, status string) (store.Record, error) {
	if err := validateRecord(store.Record{Type: objType, Scope: scope}); err != nil {
		return store.Record{}, err
	}
	b := s.bind()
	q := `SELECT ` + recordCols + ` FROM objects WHERE object_type = ` + b.arg(objType) + ` AND scope = ` + b.arg(scope) + ` AND version IS NOT NULL`
	if status != "" {
		q += ` AND status = ` + b.arg(status)
	}
	q += ` ORDER BY version DESC LIMIT 1`
	rec, err := scanRecord(objType, s.db.QueryRow(ctx, q, b.args...))
	if errors.Is(err, ErrNoRows) {
		if status != "" {
			return store.Record{}, errdefs.NotFound(fmt.Sprintf("no %s with status %q in scope %q", objType, status, scope))
		}
		return store.Record{}, errdefs.NotFound(fmt.Sprintf("no %s in scope %q", objType, scope))
	}
	if err != nil {
		return store.Record{}, s.dbErr("get "+objType, err)
	}
	return rec, nil
}

// ListScoped implements store.Store.
func (s *Store) ListScoped(ctx context.Context, objType, scope string, limit, offset int) ([]store.Record, error) {
	if err := validateRecord(store.Record{Type: objType, Scope: scope}); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, errdefs.InvalidArgument("offset must not be negative")
	}
	b := s.bind()
	rows, err := s.db.Query(ctx, `SELECT `+recordCols+` FROM objects WHERE object_type = `+b.arg(objType)+` AND scope = `+b.arg(scope)+
		` ORDER BY version DESC, created_at_ms DESC, id LIMIT `+b.arg(int64(store.Limit(limit)))+` OFFSET `+b.arg(int64(offset)), b.args...)
	if err != nil {
		return nil, s.dbErr("list "+objType, err)
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		rec, err := scanRecord(objType, rows)
		if err != nil {
			return nil, s.dbErr("list "+objType, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.dbErr("list "+objType, err)
	}
	return out, nil
}

// UpdateScoped implements store.Store.
func (s *Store) UpdateScoped(ctx context.Context, rec store.Record, expectedRV uint64) (store.WriteResult, error) {
	if err := store.ValidateType(rec.Type); err != nil {
		return store.WriteResult{}, err
	}
	now := s.now().UnixMilli()
	b := s.bind()
	q := `UPDATE objects SET status = ` + b.arg(nullStr(rec.Status)) + `, payload = ` + b.arg(nonNil(rec.Payload)) +
		`, updated_at_ms = ` + b.arg(now) + `, resource_version = resource_version + 1 WHERE object_type = ` + b.arg(rec.Type) +
		` AND id = ` + b.arg(rec.ID) + ` AND resource_version = ` + b.arg(int64(expectedRV)) + ` RETURNING resource_version, created_at_ms`
	var rv, created int64
	if err := s.db.QueryRow(ctx, q, b.args...).Scan(&rv, &created); err != nil {
		if errors.Is(err, ErrNoRows) {
			return store.WriteResult{}, s.conflict(ctx, s.db, rec.Type, rec.ID, expectedRV)
		}
		return store.WriteResult{}, s.dbErr("update "+rec.Type, err)
	}
	return store.WriteResult{ResourceVersion: uint64(rv), CreatedAtMs: created, UpdatedAtMs: now}, nil
}

// SupersedeScoped implements store.Store.
func (s *Store) SupersedeScoped(ctx context.Context, objType, scope string, belowVersion int64, status string, from ...string) (int64, error) {
	if err := validateRecord(store.Record{Type: objType, Scope: scope}); err != nil {
		return 0, err
	}
	if status == "" {
		return 0, errdefs.InvalidArgument("supersede status is required")
	}
	return s.supersede(ctx, s.db, objType, scope, belowVersion, status, from)
}

func (s *Store) supersede(ctx context.Context, q Querier, objType, scope string, below int64, status string, from []string) (int64, error) {
	b := s.bind()
	var w strings.Builder
	w.WriteString(`UPDATE objects SET status = ` + b.arg(status) + `, updated_at_ms = ` + b.arg(s.now().UnixMilli()) +
		`, resource_version = resource_version + 1 WHERE object_type = ` + b.arg(objType) + ` AND scope = ` + b.arg(scope) +
		` AND version < ` + b.arg(below) + ` AND (status IS NULL OR status <> ` + b.arg(status) + `)`)
	if len(from) > 0 {
		ph := make([]string, len(from))
		for i, f := range from {
			ph[i] = b.arg(f)
		}
		w.WriteString(` AND status IN (` + strings.Join(ph, ", ") + `)`)
	}
	n, err := q.Exec(ctx, w.String(), b.args...)
	if err != nil {
		return 0, s.dbErr("supersede "+objType, err)
	}
	return n, nil
}

// RecordHit implements store.Store.
func (s *Store) RecordHit(ctx context.Context, rec store.Record) (store.Record, bool, error) {
	if err := validateRecord(rec); err != nil {
		return store.Record{}, false, err
	}
	if rec.DedupKey == "" {
		return store.Record{}, false, errdefs.InvalidArgument(rec.Type + " dedup key is required")
	}
	if rec.ID == "" {
		rec.ID = uuid.NewString()
	}
	if rec.HitCount == 0 {
		rec.HitCount = 1
	}
	if _, owned := store.ScopeOwner(rec.Type); !owned {
		return s.recordHit(ctx, s.db, rec)
	}
	var got store.Record
	var created bool
	err := s.inTx(ctx, "record "+rec.Type, func(tx Tx) error {
		if err := s.lockOwner(ctx, tx, rec.Type, rec.Scope); err != nil {
			return err
		}
		var err error
		got, created, err = s.recordHit(ctx, tx, rec)
		return err
	})
	return got, created, err
}

// recordHit is the dedup upsert of RecordHit.
func (s *Store) recordHit(ctx context.Context, q Querier, rec store.Record) (store.Record, bool, error) {
	now := s.now().UnixMilli()
	b := s.bind()
	sqlText := `INSERT INTO objects (id, object_type, workspace, scope, version, status, dedup_key, hit_count, labels, resource_version, payload, created_at_ms, updated_at_ms) VALUES (` +
		b.arg(rec.ID) + `, ` + b.arg(rec.Type) + `, '', ` + b.arg(rec.Scope) + `, ` + b.arg(nullInt(rec.Version)) + `, ` +
		b.arg(nullStr(rec.Status)) + `, ` + b.arg(rec.DedupKey) + `, ` + b.arg(rec.HitCount) + `, ` + s.d.JSONParam(b.arg("{}")) +
		`, 1, ` + b.arg(nonNil(rec.Payload)) + `, ` + b.arg(now) + `, ` + b.arg(now) + `)` +
		` ON CONFLICT (object_type, scope, dedup_key) DO UPDATE SET hit_count = objects.hit_count + excluded.hit_count, updated_at_ms = excluded.updated_at_ms,` +
		` resource_version = objects.resource_version + 1 RETURNING ` + recordCols
	got, err := scanRecord(rec.Type, q.QueryRow(ctx, sqlText, b.args...))
	if err != nil {
		if idx, ok := s.d.UniqueViolation(err); ok && idx == "primary" {
			return store.Record{}, false, errdefs.AlreadyExists(fmt.Sprintf("%s with id %q already exists", rec.Type, rec.ID))
		}
		return store.Record{}, false, s.dbErr("record "+rec.Type, err)
	}
	return got, got.ID == rec.ID && got.ResourceVersion == 1, nil
}

// CommitPolicyRevision implements store.Store.
func (s *Store) CommitPolicyRevision(ctx context.Context, rev store.PolicyRevision) (store.PolicyRevisionResult, error) {
	if err := validateRecord(rev.Revision); err != nil {
		return store.PolicyRevisionResult{}, err
	}
	if rev.Backfill != nil {
		rev.Backfill.Type, rev.Backfill.Scope = rev.Revision.Type, rev.Revision.Scope
	}
	if p := rev.Project; p != nil {
		if err := store.ValidateType(p.Type); err != nil {
			return store.PolicyRevisionResult{}, err
		}
		if p.Msg == nil || p.ID == "" {
			return store.PolicyRevisionResult{}, errdefs.InvalidArgument("projection needs an id and a message")
		}
	}
	fault := func(step string) error {
		if rev.Fault == nil {
			return nil
		}
		return rev.Fault(step)
	}
	var res store.PolicyRevisionResult
	err := s.inTx(ctx, "commit "+rev.Revision.Type, func(tx Tx) error {
		res = store.PolicyRevisionResult{}
		if err := s.d.LockScope(ctx, tx, rev.Revision.Type, rev.Revision.Scope); err != nil {
			return s.dbErr("lock scope", err)
		}
		if err := s.lockOwner(ctx, tx, rev.Revision.Type, rev.Revision.Scope); err != nil {
			return err
		}
		if p := rev.Project; p != nil {
			// Lock the projected row before anything is written.
			if err := s.get(ctx, tx, p.Type, p.ID, p.Msg, s.d.ForUpdate()); err != nil {
				return err
			}
		}
		next, err := s.nextVersion(ctx, tx, rev.Revision.Type, rev.Revision.Scope)
		if err != nil {
			return err
		}
		if rev.Backfill != nil && next == 1 {
			bf := *rev.Backfill
			bf.Version = next
			if err := s.insertRecord(ctx, tx, &bf); err != nil {
				return err
			}
			res.Backfilled = &bf
			next++
			if err := fault("backfill"); err != nil {
				return err
			}
		}
		r := rev.Revision
		r.Version = next
		if err := s.insertRecord(ctx, tx, &r); err != nil {
			return err
		}
		res.Revision = r
		if err := fault("revision"); err != nil {
			return err
		}
		if p := rev.Project; p != nil {
			wr, err := s.mutateAndWrite(ctx, tx, p.Type, p.ID, p.ExpectedRV, p.Msg, p.Mutate)
			if err != nil {
				return err
			}
			res.Projected = wr
			if err := fault("project"); err != nil {
				return err
			}
		}
		if rev.SupersedeStatus != "" {
			n, err := s.supersede(ctx, tx, r.Type, r.Scope, r.Version, rev.SupersedeStatus, rev.SupersedeFrom)
			if err != nil {
				return err
			}
			res.Superseded = n
			if err := fault("supersede"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return store.PolicyRevisionResult{}, err
	}
	return res, nil
}
