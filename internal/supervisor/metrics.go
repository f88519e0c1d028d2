package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// checkMetricsListen checks the --metrics-listen address: host:port with
// an IP literal or localhost, and a loopback host unless allowRemote.
func checkMetricsListen(addr string, allowRemote bool) error {
	if addr == "" {
		if allowRemote {
			return errors.New("--metrics-allow-remote needs --metrics-listen")
		}
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics-listen %q: want host:port", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("--metrics-listen %q: invalid port", addr)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if host != "" && err != nil {
		return fmt.Errorf("--metrics-listen %q: the host must be an IP address or localhost", addr)
	}
	if (host == "" || !ip.IsLoopback()) && !allowRemote {
		return fmt.Errorf("--metrics-listen %q is not a loopback address: metrics name the sandbox's policies; add --metrics-allow-remote to listen there anyway", addr)
	}
	return nil
}

// newMetricsRegistry is the supervisor's registry: Go runtime and process
// collectors (the egress proxy adds its own).
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves reg as /metrics on addr, in the supervisor's
// network namespace, until ctx ends; wg owns the server goroutine.
func serveMetrics(ctx context.Context, log *slog.Logger, addr string, reg *prometheus.Registry, wg *sync.WaitGroup) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	})
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("metrics listening", "addr", ln.Addr().String())
	return nil
}
