package server

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
)

// traceAPI makes a child span inside CreateSandbox (as the store and
// driver wrappers do) and fails DeleteSandbox with an unknown error.
type traceAPI struct {
	openshellv1.UnimplementedOpenShellServer
}

func (traceAPI) CreateSandbox(ctx context.Context, r *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
	_, span := otel.Tracer("test").Start(ctx, "store.Create")
	span.End()
	return sandboxResp("sb-1", r.GetName()), nil
}

func (traceAPI) DeleteSandbox(context.Context, *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
	return nil, errors.New("disk on fire")
}

func noEnv(string) (string, bool) { return "", false }

func TestTraceSpansExported(t *testing.T) {
	rcv := telemetrytest.Start(t)
	prov := telemetry.Setup(t.Context(), &telemetry.Config{Endpoint: rcv.Endpoint, ServiceName: "gw-test"}, testLogger(t), noEnv)
	if !prov.Enabled {
		t.Fatal("Setup() did not enable export")
	}
	t.Cleanup(func() { _ = prov.Shutdown(context.Background()) })
	f := newFixture(t)
	opts := f.fullOptions(t, true)
	opts.Deps.API = traceAPI{}
	opts.TracerProvider = prov
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))

	// A client span context, sent as W3C traceparent.
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	md := metadata.MD{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(t.Context(), parent), telemetry.MetadataCarrier(md))
	ctx := metadata.NewOutgoingContext(t.Context(), md)

	var hdr metadata.MD
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "web"}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteSandbox(t.Context(), &openshellv1.DeleteSandboxRequest{Name: "web"}); err == nil {
		t.Fatal("DeleteSandbox succeeded, want Internal")
	}
	if err := prov.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}

	srv := rcv.WaitFor(t, 10*time.Second, "CreateSandbox", func(s telemetrytest.Span) bool {
		return s.Name == "openshell.v1.OpenShell/CreateSandbox"
	})
	if srv.TraceID != tid.String() || srv.ParentSpanID != sid.String() {
		t.Errorf("server span trace %s parent %s, want trace %s parent %s (client context continued)", srv.TraceID, srv.ParentSpanID, tid, sid)
	}
	if srv.Kind != tracepb.Span_SPAN_KIND_SERVER || srv.Service != "gw-test" {
		t.Errorf("server span kind %v service %q", srv.Kind, srv.Service)
	}
	if want := hdr.Get(RequestIDHeader); len(want) != 1 || srv.Attrs[telemetry.AttrRequestID] != want[0] {
		t.Errorf("span request id %q, want the response's x-request-id %q", srv.Attrs[telemetry.AttrRequestID], want)
	}
	if srv.Attrs["rpc.method"] != "CreateSandbox" || srv.Attrs["rpc.service"] != "openshell.v1.OpenShell" || srv.Attrs["rpc.grpc.status_code"] != "0" || srv.StatusCode != tracepb.Status_STATUS_CODE_UNSET {
		t.Errorf("server span attrs %v status %v", srv.Attrs, srv.StatusCode)
	}
	child := rcv.WaitFor(t, 10*time.Second, "store.Create", func(s telemetrytest.Span) bool { return s.Name == "store.Create" })
	if child.ParentSpanID != srv.SpanID || child.TraceID != srv.TraceID {
		t.Errorf("child span parent %s trace %s, want %s %s", child.ParentSpanID, child.TraceID, srv.SpanID, srv.TraceID)
	}
	del := rcv.WaitFor(t, 10*time.Second, "DeleteSandbox", func(s telemetrytest.Span) bool {
		return s.Name == "openshell.v1.OpenShell/DeleteSandbox"
	})
	if del.StatusCode != tracepb.Status_STATUS_CODE_ERROR || del.Attrs["rpc.grpc.status_code"] != "13" || del.ParentSpanID != "" {
		t.Errorf("DeleteSandbox span status %v attrs %v parent %q, want ERROR, code 13 (Internal), a root span", del.StatusCode, del.Attrs, del.ParentSpanID)
	}
}

// TestTraceCollectorUnreachable: with no collector listening the gateway
// answers as usual and flushing gives up within its deadline.
func TestTraceCollectorUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	prov := telemetry.Setup(t.Context(), &telemetry.Config{Endpoint: dead}, testLogger(t), noEnv)
	f := newFixture(t)
	opts := f.fullOptions(t, true)
	opts.Deps.API = traceAPI{}
	opts.TracerProvider = prov
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))
	for range 20 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "web"})
		cancel()
		if err != nil {
			t.Fatalf("CreateSandbox with an unreachable collector = %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_ = prov.Shutdown(ctx) // fails: nobody listens; the batch is dropped
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Shutdown took %v with an unreachable collector", d)
	}
}

func TestTraceMalformedEndpointDisablesExport(t *testing.T) {
	for _, ep := range []string{"otel:4317", "ftp://otel:4317", "http://otel", "http://otel:4317/v1/traces", "http://[::1"} {
		prov := telemetry.Setup(t.Context(), &telemetry.Config{Endpoint: ep}, testLogger(t), noEnv)
		if prov.Enabled {
			t.Errorf("Setup(endpoint %q) enabled export, want it off", ep)
		}
	}
	// OTEL_EXPORTER_OTLP_ENDPOINT alone never turns export on.
	env := func(k string) (string, bool) {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return "http://127.0.0.1:4317", true
		}
		return "", false
	}
	if prov := telemetry.Setup(t.Context(), nil, testLogger(t), env); prov.Enabled {
		t.Error("Setup(no table, OTEL_EXPORTER_OTLP_ENDPOINT set) enabled export")
	}
}
