package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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

// TestServerSpanAttributes: a server span has its RPC attributes, the
// request id and exactly one status code, OK or the error's (which
// overrides the OK it starts with), and an Error status only for server
// errors; a span the sampler drops gets no attributes.
func TestServerSpanAttributes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	for _, tc := range []struct {
		err        error
		wantCode   int64
		wantStatus otelcodes.Code
	}{
		{nil, 0, otelcodes.Unset},
		{status.Error(codes.NotFound, "no"), int64(codes.NotFound), otelcodes.Unset},
		{status.Error(codes.Internal, "boom"), int64(codes.Internal), otelcodes.Error},
	} {
		_, span := StartServerSpan(t.Context(), tp.Tracer("test"), "/pkg.S/M", "req-1")
		EndServerSpan(span, tc.err)
		ended := rec.Ended()
		got := ended[len(ended)-1]
		attrs := map[attribute.Key][]attribute.Value{}
		for _, a := range got.Attributes() {
			attrs[a.Key] = append(attrs[a.Key], a.Value)
		}
		if c := attrs[attrCode]; len(c) != 1 || c[0].AsInt64() != tc.wantCode {
			t.Errorf("%v: status code attributes %v, want exactly [%d]", tc.err, c, tc.wantCode)
		}
		if got.Name() != "pkg.S/M" || got.SpanKind() != trace.SpanKindServer || attrs[AttrRequestID][0].AsString() != "req-1" ||
			attrs[attrService][0].AsString() != "pkg.S" || attrs[attrMethod][0].AsString() != "M" || attrs[attrRPCSystem][0].AsString() != "grpc" {
			t.Errorf("%v: span %q kind %v attributes %v", tc.err, got.Name(), got.SpanKind(), attrs)
		}
		if got.Status().Code != tc.wantStatus {
			t.Errorf("%v: span status %v, want %v", tc.err, got.Status(), tc.wantStatus)
		}
	}
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(rec))
	_, span := StartServerSpan(t.Context(), never.Tracer("test"), "/pkg.S/M", "req-2")
	if span.IsRecording() {
		t.Error("a span the sampler dropped is recording")
	}
	EndServerSpan(span, nil)
}

// TestClientSpanStatus: a client span carries exactly one status code and
// an Error status for every code but OK.
func TestClientSpanStatus(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	for _, want := range []codes.Code{codes.OK, codes.NotFound, codes.Unavailable} {
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return status.Error(want, "x")
		}
		_ = UnaryClientInterceptor()(t.Context(), "/pkg.D/Call", nil, nil, nil, invoker)
		ended := rec.Ended()
		got := ended[len(ended)-1]
		var codesSeen []int64
		for _, a := range got.Attributes() {
			if a.Key == attrCode {
				codesSeen = append(codesSeen, a.Value.AsInt64())
			}
		}
		if len(codesSeen) != 1 || codesSeen[0] != int64(want) || got.SpanKind() != trace.SpanKindClient || got.Name() != "pkg.D/Call" {
			t.Errorf("%v: span %q kind %v status codes %v, want exactly [%d]", want, got.Name(), got.SpanKind(), codesSeen, want)
		}
		if wantErr := want != codes.OK; (got.Status().Code == otelcodes.Error) != wantErr {
			t.Errorf("%v: span status %v", want, got.Status())
		}
	}
}

// BenchmarkServerSpan measures what tracing adds to an inbound RPC on the
// server: continuing the caller's W3C context, starting the server span
// with its attributes and request id, recording the status and ending it
// into the SDK's batch span processor (exporting to nowhere).
func BenchmarkServerSpan(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("bench")
	md := metadata.MD{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	ctx := metadata.NewIncomingContext(context.Background(), md)
	b.ReportAllocs()
	for b.Loop() {
		_, span := StartServerSpan(ctx, tracer, "/openshell.v1.OpenShell/GetCurrentUser", "0b1d3f5e-8c1a-4d2b-9e7f-6a5c4b3d2e1f")
		EndServerSpan(span, nil)
	}
}
