package gatewaytest

import (
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
)

// TestCLITraceParent: the real CLI with TRACEPARENT in its environment
// passes the trace on (OpenShell's CLI does the same), so the gateway's
// span for the RPC continues it: same trace id, the given span as parent.
// Without the variable the CLI's call starts a trace of its own.
func TestCLITraceParent(t *testing.T) {
	rcv := telemetrytest.Start(t)
	g := Start(t, Options{
		ExtraArgs: []string{"--config", otlpConfig(t, rcv.Endpoint)},
		Env:       []string{"OTEL_BSP_SCHEDULE_DELAY=50"},
	})
	c := newCLI(t, g)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	c.env = append(c.env, "TRACEPARENT=00-"+traceID+"-"+parentID+"-01", "TRACESTATE=ci=1")
	c.ok("sandbox", "list")
	rcv.WaitFor(t, 10*time.Second, "ListSandboxes continuing the CLI's TRACEPARENT", func(s telemetrytest.Span) bool {
		return s.Name == "openshell.v1.OpenShell/ListSandboxes" && s.TraceID == traceID && s.ParentSpanID == parentID
	})

	c.env = append(c.env, "TRACEPARENT=")
	c.ok("provider", "list")
	s := rcv.WaitFor(t, 10*time.Second, "ListProviders as a root span", func(s telemetrytest.Span) bool {
		return s.Name == "openshell.v1.OpenShell/ListProviders"
	})
	if s.TraceID == traceID || s.ParentSpanID != "" {
		t.Errorf("ListProviders without TRACEPARENT: trace %s parent %q, want a new root", s.TraceID, s.ParentSpanID)
	}
}
