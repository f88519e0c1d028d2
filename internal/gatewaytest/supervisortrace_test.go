package gatewaytest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
)

// TestSupervisorTracing: a gateway with [openshell.gateway.otlp] starts a
// sandbox (process driver, real supervisor binary) whose supervisor
// exports its own client spans of its gateway calls to the same real OTLP
// receiver, as service "<service_name>-sandbox", with the W3C context on
// the calls: the gateway's server span of the call is the supervisor
// span's child in the same trace. The in-process driver's compute.Create
// is a child of the CreateSandbox span.
func TestSupervisorTracing(t *testing.T) {
	rcv := telemetrytest.Start(t)
	g := Start(t, Options{
		ExtraArgs: []string{"--config", otlpConfig(t, rcv.Endpoint)},
		Env:       []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
	})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "traced")
	if _, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}}); err != nil || code != 0 {
		t.Fatalf("Exec = exit %d, %v", code, err)
	}

	create := rcv.WaitFor(t, 10*time.Second, "the CreateSandbox server span", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e" && s.Name == "openshell.v1.OpenShell/CreateSandbox"
	})
	rcv.WaitFor(t, 10*time.Second, "compute.Create under CreateSandbox", func(s telemetrytest.Span) bool {
		return s.Name == "compute.Create" && s.ParentSpanID == create.SpanID && s.TraceID == create.TraceID
	})
	sup := rcv.WaitFor(t, 30*time.Second, "the supervisor's GetSandboxConfig client span", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e-sandbox" && s.Name == "openshell.v1.OpenShell/GetSandboxConfig"
	})
	rcv.WaitFor(t, 10*time.Second, "the gateway's GetSandboxConfig server span under the supervisor's", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e" && s.Name == sup.Name && s.ParentSpanID == sup.SpanID && s.TraceID == sup.TraceID
	})
	session := rcv.WaitFor(t, 30*time.Second, "the supervisor's ConnectSupervisor span", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e-sandbox" && s.Name == "openshell.v1.OpenShell/ConnectSupervisor"
	})

	// The exec's relay: the supervisor's relay span is a child of its
	// session span, its RelayStream call a child of the relay span, the
	// gateway's RelayStream span a child of that call and linked to the
	// ExecSandbox span that asked for the relay.
	exec := rcv.WaitFor(t, 10*time.Second, "the ExecSandbox server span", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e" && s.Name == "openshell.v1.OpenShell/ExecSandbox"
	})
	relay := rcv.WaitFor(t, 30*time.Second, "the supervisor's relay span under its session", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e-sandbox" && s.Name == "supervisor.Relay" && s.ParentSpanID == session.SpanID && s.TraceID == session.TraceID
	})
	call := rcv.WaitFor(t, 10*time.Second, "the supervisor's RelayStream span under the relay span", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e-sandbox" && s.Name == "openshell.v1.OpenShell/RelayStream" && s.ParentSpanID == relay.SpanID && s.TraceID == relay.TraceID
	})
	// The gateway's span of the RelayStream covers its life (the gateway
	// may keep the relay for more calls): deleting the sandbox ends it.
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "traced"}); err != nil {
		t.Fatal(err)
	}
	rcv.WaitFor(t, 30*time.Second, "the gateway's RelayStream span under the supervisor's, linked to the exec", func(s telemetrytest.Span) bool {
		return s.Service == "gw-e2e" && s.Name == call.Name && s.ParentSpanID == call.SpanID && s.TraceID == call.TraceID &&
			slices.Contains(s.Links, exec.TraceID+"/"+exec.SpanID)
	})
}

// TestSupervisorTracingOff: without [openshell.gateway.otlp] the
// supervisor exports nothing, even with OTEL_* variables pointing at the
// receiver in the gateway's environment and a sandbox spec that sets the
// supervisor's OTLP variables itself (the driver drops them). The test
// deletes the sandbox, whose supervisor would flush what it had on exit.
func TestSupervisorTracingOff(t *testing.T) {
	rcv := telemetrytest.Start(t)
	g := Start(t, Options{Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.Endpoint, "OTEL_BSP_SCHEDULE_DELAY=100"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "untraced", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"},
		Environment: map[string]string{
			"OPENSHELL_OTLP_ENDPOINT": rcv.Endpoint, "OPENSHELL_OTLP_SERVICE_NAME": "from-spec",
			"OPENSHELL_OTEL_BSP_SCHEDULE_DELAY": "100",
		},
	}}); err != nil {
		t.Fatal(err)
	}
	sb := WaitPhase(ctx, t, c, "untraced", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	out, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"env"}})
	if err != nil || code != 0 {
		t.Fatalf("Exec = exit %d, %v", code, err)
	}
	if strings.Contains(out, "OPENSHELL_OTLP") || strings.Contains(out, "OPENSHELL_OTEL") {
		t.Errorf("agent environment carries supervisor OTLP variables:\n%s", out)
	}
	// Deleting the sandbox stops its supervisor (SIGTERM, waited for), which
	// flushes whatever spans it had before it exits.
	if del, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "untraced"}); err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteSandbox = %v, %v", del, err)
	}
	if spans := rcv.Spans(); len(spans) != 0 {
		t.Errorf("receiver got %d spans without [openshell.gateway.otlp], first %+v", len(spans), spans[0])
	}
}
