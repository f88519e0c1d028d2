package telemetry

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// TestClientCallCarriesRequestIDAndContext: a call made under a server
// span sends that span's request id and W3C context on.
func TestClientCallCarriesRequestIDAndContext(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	ctx, span := StartServerSpan(t.Context(), tp.Tracer("test"), "/pkg.S/M", "req-42")
	defer span.End()
	var sent metadata.MD
	invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		sent, _ = metadata.FromOutgoingContext(ctx)
		return nil
	}
	if err := UnaryClientInterceptor()(ctx, "/pkg.D/Call", nil, nil, nil, invoker); err != nil {
		t.Fatal(err)
	}
	if got := sent.Get("x-request-id"); len(got) != 1 || got[0] != "req-42" {
		t.Errorf("x-request-id = %v, want [req-42]", got)
	}
	if got := sent.Get("traceparent"); len(got) != 1 || len(got[0]) != 55 {
		t.Errorf("traceparent = %v, want one W3C header", got)
	}
}
