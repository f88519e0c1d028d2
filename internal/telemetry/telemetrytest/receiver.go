// Package telemetrytest is a real OTLP/gRPC trace receiver for tests: the
// collector's TraceService on a grpc.Server on loopback, keeping every span
// it is sent.
package telemetrytest

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is a received span, flattened.
type Span struct {
	Name         string
	TraceID      string
	SpanID       string
	ParentSpanID string
	Kind         tracepb.Span_SpanKind
	StatusCode   tracepb.Status_StatusCode
	Attrs        map[string]string
	Service      string
	// Links are the linked spans, as "traceid/spanid".
	Links []string
}

// Receiver collects spans. Safe for concurrent use.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	// Addr is host:port; Endpoint is http://Addr.
	Addr, Endpoint string

	mu    sync.Mutex
	spans []Span
}

// Start serves a receiver on a loopback port until the test ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &Receiver{Addr: ln.Addr().String(), Endpoint: "http://" + ln.Addr().String()}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	tb.Cleanup(func() { srv.Stop(); <-done })
	return r
}

// Export implements the collector's TraceService.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := str(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Kind: s.GetKind(),
					StatusCode: s.GetStatus().GetCode(), Attrs: str(s.GetAttributes()), Service: service,
					Links: links(s.GetLinks()),
				})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func links(ls []*tracepb.Span_Link) []string {
	var out []string
	for _, l := range ls {
		out = append(out, hex.EncodeToString(l.GetTraceId())+"/"+hex.EncodeToString(l.GetSpanId()))
	}
	return out
}

// str flattens attributes: strings as they are, integers, doubles and
// booleans in their Go formatting, other kinds in protobuf text form.
func str(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = strconv.FormatFloat(v.DoubleValue, 'g', -1, 64)
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor polls until a received span satisfies match, or fails the test
// after timeout.
func (r *Receiver) WaitFor(tb testing.TB, timeout time.Duration, what string, match func(Span) bool) Span {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, s := range r.Spans() {
			if match(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no span %s within %v; received %+v", what, timeout, r.Spans())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
