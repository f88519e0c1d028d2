package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"

	"google.golang.org/grpc"

	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// setupTelemetry turns OTLP trace export on when the driver passed the
// gateway's settings (telemetry.SupervisorEnv: only when the gateway has
// [openshell.gateway.otlp]); otherwise spans go nowhere. With a host
// dialer (the process driver's private network namespace) the collector
// is dialed through it. Export is best effort and never fails the
// supervisor.
func setupTelemetry(ctx context.Context, cfg Config, stderr io.Writer, dialer *hostdial.Client) *telemetry.Provider {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With("sandbox_id", cfg.SandboxID)
	var dial func(ctx context.Context, addr string) (net.Conn, error)
	if dialer != nil {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			ap, err := resolveAddrPort(ctx, addr)
			if err != nil {
				return nil, err
			}
			return dialer.Dial(ctx, ap)
		}
	}
	return telemetry.SetupSupervisor(ctx, log, dial)
}

// resolveAddrPort turns "host:port" into an address the host dialer takes.
func resolveAddrPort(ctx context.Context, addr string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("collector address %q: %w", addr, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("collector port %q: %w", port, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("resolve collector %s: %w", host, err)
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(p)), nil
}

// tracingDialOptions make a client span per gateway call and carry its
// W3C trace context, so the gateway's server spans join the supervisor's
// traces. With export off they cost a no-op span.
func tracingDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(telemetry.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(telemetry.StreamClientInterceptor()),
	}
}
