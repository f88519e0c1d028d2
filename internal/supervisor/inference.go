package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"google.golang.org/grpc"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	supinference "github.com/openshell-go/openshell/internal/supervisor/inference"
)

// newInferenceRouter returns the inference.local router of the egress
// proxy: it reaches upstreams with the proxy's dial (the host dialer, or
// a direct dial in fence mode), resolving names with the proxy's
// resolver, and is not subject to the network policy (the upstream is
// the operator's route, never chosen by the agent).
func newInferenceRouter(log *slog.Logger, cfg Config, resolver egress.Resolver, dialAddr func(context.Context, netip.AddrPort) (net.Conn, error)) *supinference.Router {
	dial := func(ctx context.Context, _, addr string) (net.Conn, error) {
		host, ps, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(ps, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", ps, err)
		}
		addrs := []netip.Addr{}
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = append(addrs, a)
		} else if addrs, err = resolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		var errs []error
		for _, a := range addrs {
			c, err := dialAddr(ctx, netip.AddrPortFrom(a.Unmap(), uint16(port)))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, fmt.Errorf("%s has no address", host)
		}
		return nil, errors.Join(errs...)
	}
	return supinference.New(supinference.Options{Logger: log, Dial: dial, RootCAs: cfg.upstreamRoots})
}

// serveInference is the egress proxy's hook for inference.local.
func serveInference(r *supinference.Router) func(c net.Conn, req *http.Request, caller egress.Caller) bool {
	return func(c net.Conn, req *http.Request, caller egress.Caller) bool {
		return r.Serve(c, req, supinference.Caller{Binary: caller.Exe, PID: caller.PID})
	}
}

// pollInference keeps the router's bundle current until ctx ends. The
// first bundle is fetched at once; the returned function waits for it
// (agents start after it). A failed first fetch is retried at once by
// the poll loop, which logs failures.
func pollInference(ctx context.Context, wg *sync.WaitGroup, conn grpc.ClientConnInterface, r *supinference.Router) (firstFetched func()) {
	if r == nil {
		return func() {}
	}
	client := inferencev1.NewInferenceClient(conn)
	fetch := func(ctx context.Context) (*inferencev1.GetInferenceBundleResponse, error) {
		return client.GetInferenceBundle(ctx, &inferencev1.GetInferenceBundleRequest{})
	}
	first := make(chan struct{})
	wg.Go(func() {
		err := r.Refresh(ctx, fetch)
		close(first)
		if err == nil && sleepCtx(ctx, supinference.DefaultPollInterval) != nil {
			return
		}
		r.Poll(ctx, fetch, supinference.DefaultPollInterval)
	})
	return func() { <-first }
}
