package remote_test

import (
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/openshell-go/openshell/internal/compute"
)

// TestTraceContextReachesServedDriver: a call through the remote driver is
// a client span under the caller's span, and `driver serve` continues the
// W3C context it sent with a server span under that client span.
func TestTraceContextReachesServedDriver(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	d := serve(t, &fakeDriver{})
	ctx, parent := tp.Tracer("test").Start(t.Context(), "rpc")
	if _, err := d.Get(ctx, compute.Ref{ID: "sb1", Name: "web"}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	const name = "openshell.compute.v1.ComputeDriver/GetSandbox"
	var client, server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() != name {
			continue
		}
		switch s.SpanKind() {
		case trace.SpanKindClient:
			client = s
		case trace.SpanKindServer:
			server = s
		}
	}
	if client == nil || server == nil {
		var names []string
		for _, s := range rec.Ended() {
			names = append(names, s.Name()+"/"+s.SpanKind().String())
		}
		t.Fatalf("want a client and a server span %s, got %v", name, names)
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span parent %v, want the caller's span %v", client.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if server.Parent().SpanID() != client.SpanContext().SpanID() || !server.Parent().IsRemote() || server.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("server span parent %v (remote %v) trace %v, want the client span %v over the wire, trace %v",
			server.Parent().SpanID(), server.Parent().IsRemote(), server.SpanContext().TraceID(), client.SpanContext().SpanID(), parent.SpanContext().TraceID())
	}
}
