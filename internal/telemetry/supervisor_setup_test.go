package telemetry_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
)

// TestSetupSupervisor: with the gateway's settings in the environment the
// supervisor exports to a real OTLP receiver under the forwarded service
// name, through the given dialer, with the forwarded batch delay (100 ms,
// well under the SDK's 5 s default and the wait below); the sandbox's own
// OTEL_* variables are hidden from the SDK and restored afterwards.
func TestSetupSupervisor(t *testing.T) {
	rcv := telemetrytest.Start(t)
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	t.Setenv(telemetry.EnvSupervisorServiceName, "gw-sandbox")
	t.Setenv(telemetry.EnvSupervisorEndpoint, rcv.Endpoint)
	t.Setenv("OPENSHELL_OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")                 // the agent's: must not apply
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // likewise
	var dials atomic.Int32
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	p := telemetry.SetupSupervisor(t.Context(), slog.New(slog.DiscardHandler), dial)
	if !p.Enabled {
		t.Fatal("export off with the gateway's settings")
	}
	t.Cleanup(func() { telemetry.FlushSupervisor(p, slog.New(slog.DiscardHandler)) })
	if v := os.Getenv("OTEL_BSP_SCHEDULE_DELAY"); v != "600000" {
		t.Errorf("OTEL_BSP_SCHEDULE_DELAY after setup = %q, want the agent's value back", v)
	}
	_, span := otel.Tracer("test").Start(t.Context(), "supervisor-op")
	span.End()
	got := rcv.WaitFor(t, 3*time.Second, "the supervisor span", func(s telemetrytest.Span) bool { return s.Name == "supervisor-op" })
	if got.Service != "gw-sandbox" {
		t.Errorf("service.name = %q, want gw-sandbox", got.Service)
	}
	if dials.Load() == 0 {
		t.Error("the exporter did not use the given dialer")
	}
}

// TestSetupSupervisorOff: without the gateway's settings nothing is
// exported, whatever OTEL_* variables say.
func TestSetupSupervisorOff(t *testing.T) {
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	if p := telemetry.SetupSupervisor(t.Context(), slog.New(slog.DiscardHandler), nil); p.Enabled {
		t.Error("export on without OPENSHELL_OTLP_SERVICE_NAME")
	}
}
