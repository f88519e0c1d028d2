package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
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
