package storetrace_test

import (
	"context"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
	"github.com/openshell-go/openshell/internal/store/storetest"
	"github.com/openshell-go/openshell/internal/store/storetrace"
)

func openSQLite(t testing.TB) store.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "gateway.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTraceStoreConformance: the traced store is still a store.
func TestTraceStoreConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) store.Store { return storetrace.New(openSQLite(t)) })
}

// TestTraceStoreSpans: a call is a child span of the caller's span.
func TestTraceStoreSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	st := storetrace.New(openSQLite(t))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "rpc")
	sb := &openshellv1.Sandbox{}
	err := st.Get(ctx, store.TypeSandbox, "missing", sb)
	parent.End()
	if err == nil {
		t.Fatal("Get(missing) = nil")
	}
	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "store.Get" {
			got = s
		}
	}
	if got == nil {
		t.Fatalf("no store.Get span in %v", rec.Ended())
	}
	if got.Parent().SpanID() != parent.SpanContext().SpanID() || got.Status().Code.String() != "Error" {
		t.Errorf("store.Get parent %v status %v, want the rpc span and Error", got.Parent().SpanID(), got.Status())
	}
}
