// Package storetrace wraps a store.Store so that each call is an
// OpenTelemetry span (from the global tracer provider) under the caller's
// span. Safe for concurrent use as the store it wraps.
package storetrace

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/openshell-go/openshell/internal/store"
)

// New wraps s so that every store call is a span (named "store.<Method>",
// attribute openshell.object_type) under the caller's span, from the
// global tracer provider. Ids, names and payloads are not recorded; an
// error sets the span's status to Error.
func New(s store.Store) store.Store { return &tracedStore{Store: s} }

const scope = "github.com/openshell-go/openshell/internal/store/storetrace"

type tracedStore struct{ store.Store }

var _ store.Store = (*tracedStore)(nil)

func storeSpan(ctx context.Context, method, objType string) (context.Context, trace.Span) {
	return otel.Tracer(scope).Start(ctx, "store."+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("openshell.object_type", objType)))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(otelcodes.Error, "store error")
	}
	span.End()
}

func (s *tracedStore) Create(ctx context.Context, t string, m proto.Message) (r store.WriteResult, err error) {
	ctx, sp := storeSpan(ctx, "Create", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.Create(ctx, t, m)
}

func (s *tracedStore) Update(ctx context.Context, t string, m proto.Message, rv uint64) (r store.WriteResult, err error) {
	ctx, sp := storeSpan(ctx, "Update", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.Update(ctx, t, m, rv)
}

func (s *tracedStore) UpdateCAS(ctx context.Context, t, id string, rv uint64, m proto.Message, f func(proto.Message) error) (r store.WriteResult, err error) {
	ctx, sp := storeSpan(ctx, "UpdateCAS", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.UpdateCAS(ctx, t, id, rv, m, f)
}

func (s *tracedStore) Get(ctx context.Context, t, id string, m proto.Message) (err error) {
	ctx, sp := storeSpan(ctx, "Get", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.Get(ctx, t, id, m)
}

func (s *tracedStore) GetByName(ctx context.Context, t, ws, name string, m proto.Message) (err error) {
	ctx, sp := storeSpan(ctx, "GetByName", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.GetByName(ctx, t, ws, name, m)
}

func (s *tracedStore) List(ctx context.Context, t string, o store.ListOptions) (r []store.Object, err error) {
	ctx, sp := storeSpan(ctx, "List", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.List(ctx, t, o)
}

func (s *tracedStore) Delete(ctx context.Context, t, id string) (ok bool, err error) {
	ctx, sp := storeSpan(ctx, "Delete", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.Delete(ctx, t, id)
}

func (s *tracedStore) DeleteIf(ctx context.Context, t, id string, rv uint64) (err error) {
	ctx, sp := storeSpan(ctx, "DeleteIf", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.DeleteIf(ctx, t, id, rv)
}

func (s *tracedStore) DeleteByScope(ctx context.Context, t, scope string) (n int64, err error) {
	ctx, sp := storeSpan(ctx, "DeleteByScope", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.DeleteByScope(ctx, t, scope)
}

func (s *tracedStore) CreateScoped(ctx context.Context, rec store.Record) (r store.Record, err error) {
	ctx, sp := storeSpan(ctx, "CreateScoped", rec.Type)
	defer func() { endSpan(sp, err) }()
	return s.Store.CreateScoped(ctx, rec)
}

func (s *tracedStore) GetScoped(ctx context.Context, t, id string) (r store.Record, err error) {
	ctx, sp := storeSpan(ctx, "GetScoped", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.GetScoped(ctx, t, id)
}

func (s *tracedStore) GetLatestScoped(ctx context.Context, t, scope, st string) (r store.Record, err error) {
	ctx, sp := storeSpan(ctx, "GetLatestScoped", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.GetLatestScoped(ctx, t, scope, st)
}

func (s *tracedStore) ListScoped(ctx context.Context, t, scope string, limit, offset int) (r []store.Record, err error) {
	ctx, sp := storeSpan(ctx, "ListScoped", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.ListScoped(ctx, t, scope, limit, offset)
}

func (s *tracedStore) UpdateScoped(ctx context.Context, rec store.Record, rv uint64) (r store.WriteResult, err error) {
	ctx, sp := storeSpan(ctx, "UpdateScoped", rec.Type)
	defer func() { endSpan(sp, err) }()
	return s.Store.UpdateScoped(ctx, rec, rv)
}

func (s *tracedStore) SupersedeScoped(ctx context.Context, t, scope string, below int64, st string, from ...string) (n int64, err error) {
	ctx, sp := storeSpan(ctx, "SupersedeScoped", t)
	defer func() { endSpan(sp, err) }()
	return s.Store.SupersedeScoped(ctx, t, scope, below, st, from...)
}

func (s *tracedStore) RecordHit(ctx context.Context, rec store.Record) (r store.Record, created bool, err error) {
	ctx, sp := storeSpan(ctx, "RecordHit", rec.Type)
	defer func() { endSpan(sp, err) }()
	return s.Store.RecordHit(ctx, rec)
}

func (s *tracedStore) CommitPolicyRevision(ctx context.Context, rev store.PolicyRevision) (r store.PolicyRevisionResult, err error) {
	ctx, sp := storeSpan(ctx, "CommitPolicyRevision", "")
	defer func() { endSpan(sp, err) }()
	return s.Store.CommitPolicyRevision(ctx, rev)
}

func (s *tracedStore) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (l store.Lease, err error) {
	ctx, sp := storeSpan(ctx, "AcquireLease", "lease")
	defer func() { endSpan(sp, err) }()
	return s.Store.AcquireLease(ctx, name, holder, ttl)
}

func (s *tracedStore) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (r store.Lease, err error) {
	ctx, sp := storeSpan(ctx, "RenewLease", "lease")
	defer func() { endSpan(sp, err) }()
	return s.Store.RenewLease(ctx, l, ttl)
}

func (s *tracedStore) ReleaseLease(ctx context.Context, l store.Lease) (err error) {
	ctx, sp := storeSpan(ctx, "ReleaseLease", "lease")
	defer func() { endSpan(sp, err) }()
	return s.Store.ReleaseLease(ctx, l)
}
