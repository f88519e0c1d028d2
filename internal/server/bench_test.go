package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
	"github.com/openshell-go/openshell/internal/version"
)

// bareService answers like the gateway, without any of its machinery.
type bareService struct {
	openshellv1.UnimplementedOpenShellServer
}

func (bareService) Health(context.Context, *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error) {
	return &openshellv1.HealthResponse{Status: openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY, Version: version.Version}, nil
}

func (bareService) GetCurrentUser(context.Context, *openshellv1.GetCurrentUserRequest) (*openshellv1.GetCurrentUserResponse, error) {
	return &openshellv1.GetCurrentUserResponse{Subject: "alice", DisplayName: "alice", Roles: []string{"openshell-user"}, IdentityProvider: "mtls"}, nil
}

// startBare serves bareService with plain grpc-go (TLS when conf is set).
func startBare(b *testing.B, conf *tls.Config) string {
	b.Helper()
	var opts []grpc.ServerOption
	if conf != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(conf)))
	}
	g := grpc.NewServer(opts...)
	openshellv1.RegisterOpenShellServer(g, bareService{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	b.Cleanup(func() { g.Stop(); <-done })
	return ln.Addr().String()
}

// BenchmarkHealth calls Health through the full gateway stack (one-port
// sniffing listener, interceptors, every authenticator configured, access
// log on) and, in the same loop, on a bare grpc-go server answering the
// same message. It reports both latencies and their ratio.
func BenchmarkHealth(b *testing.B) {
	f := newFixture(b)
	for _, tc := range []struct {
		name string
		tls  bool
		rpc  string
	}{
		{"tls=off/Health", false, "Health"},
		{"tls=on/Health", true, "Health"},
		{"tls=on/GetCurrentUser-mtls", true, "GetCurrentUser"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opts := f.fullOptions(b, false)
			opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			var clientTLS *tls.Config
			var bareTLS *tls.Config
			if tc.tls {
				clientTLS = f.clientTLS(f.userCert)
				bareTLS = f.serverTLS()
			} else {
				opts.TLSConfig = nil
			}
			_, gwAddr := startServer(b, opts)
			bareAddr := startBare(b, bareTLS)
			gw := openshellv1.NewOpenShellClient(dial(b, gwAddr, clientTLS))
			bare := openshellv1.NewOpenShellClient(dial(b, bareAddr, clientTLS))
			call := func(c openshellv1.OpenShellClient) {
				var err error
				if tc.rpc == "Health" {
					_, err = c.Health(b.Context(), &openshellv1.HealthRequest{})
				} else {
					_, err = c.GetCurrentUser(b.Context(), &openshellv1.GetCurrentUserRequest{})
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			// Warm both connections up (handshakes, discovery).
			call(gw)
			call(bare)
			var gwTotal, bareTotal time.Duration
			n := 0
			for b.Loop() {
				t0 := time.Now()
				call(bare)
				t1 := time.Now()
				call(gw)
				gwTotal += time.Since(t1)
				bareTotal += t1.Sub(t0)
				n++
			}
			b.ReportMetric(float64(gwTotal.Nanoseconds())/float64(n), "gateway-ns/op")
			b.ReportMetric(float64(bareTotal.Nanoseconds())/float64(n), "bare-ns/op")
			b.ReportMetric(float64(gwTotal)/float64(bareTotal), "ratio")
		})
	}
}

// BenchmarkTracing calls a unary RPC through two gateway stacks in the same
// loop, alternating: one with OTLP tracing on (the SDK's batcher exporting
// to a real OTLP/gRPC receiver on loopback, W3C context continued from the
// client), one with tracing off. It reports both mean latencies and their
// ratio, and both medians and theirs (p50-ratio): on a loaded machine a
// preempted call weighs on the mean of whichever side it hit, the median
// shrugs it off.
func BenchmarkTracing(b *testing.B) {
	f := newFixture(b)
	rcv := telemetrytest.Start(b)
	prov := telemetry.Setup(b.Context(), &telemetry.Config{Endpoint: rcv.Endpoint}, slog.New(slog.DiscardHandler), func(string) (string, bool) { return "", false })
	b.Cleanup(func() { _ = prov.Shutdown(context.Background()) })
	start := func(tp bool) openshellv1.OpenShellClient {
		opts := f.fullOptions(b, true)
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		opts.TLSConfig = nil
		if tp {
			opts.TracerProvider = prov
		}
		_, addr := startServer(b, opts)
		return openshellv1.NewOpenShellClient(dial(b, addr, nil))
	}
	on, off := start(true), start(false)
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	md := metadata.MD{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(b.Context(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})), telemetry.MetadataCarrier(md))
	ctx := metadata.NewOutgoingContext(b.Context(), md)
	call := func(c openshellv1.OpenShellClient) {
		if _, err := c.GetCurrentUser(ctx, &openshellv1.GetCurrentUserRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	call(on)
	call(off)
	var onTimes, offTimes []time.Duration
	for i := 0; b.Loop(); i++ {
		first, second, firstTimes, secondTimes := off, on, &offTimes, &onTimes
		if i%2 == 1 { // neither side always runs right after the other
			first, second, firstTimes, secondTimes = on, off, &onTimes, &offTimes
		}
		t0 := time.Now()
		call(first)
		t1 := time.Now()
		call(second)
		*secondTimes = append(*secondTimes, time.Since(t1))
		*firstTimes = append(*firstTimes, t1.Sub(t0))
	}
	onMean, onP50 := meanAndMedian(onTimes)
	offMean, offP50 := meanAndMedian(offTimes)
	b.ReportMetric(onMean, "traced-ns/op")
	b.ReportMetric(offMean, "untraced-ns/op")
	b.ReportMetric(onMean/offMean, "ratio")
	b.ReportMetric(onP50, "traced-p50-ns")
	b.ReportMetric(offP50, "untraced-p50-ns")
	b.ReportMetric(onP50/offP50, "p50-ratio")
	b.ReportMetric(float64(onTimes[len(onTimes)*99/100]), "traced-p99-ns")
	b.ReportMetric(float64(offTimes[len(offTimes)*99/100]), "untraced-p99-ns")
	b.ReportMetric(float64(onTimes[len(onTimes)*9/10]), "traced-p90-ns")
	b.ReportMetric(float64(offTimes[len(offTimes)*9/10]), "untraced-p90-ns")
}

// meanAndMedian returns the mean and the median of ds in nanoseconds, and
// sorts ds.
func meanAndMedian(ds []time.Duration) (mean, median float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	slices.Sort(ds)
	return float64(sum.Nanoseconds()) / float64(len(ds)), float64(ds[len(ds)/2].Nanoseconds())
}
