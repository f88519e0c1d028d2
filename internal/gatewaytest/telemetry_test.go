package gatewaytest

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/securityevent"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/telemetry/telemetrytest"
)

func otlpConfig(t *testing.T, endpoint string) string {
	t.Helper()
	path := filepath.Join(TempDir(t), "gw.toml")
	toml := "[openshell]\nversion = 1\n\n[openshell.gateway.otlp]\nendpoint = \"" + endpoint + "\"\nservice_name = \"gw-e2e\"\n"
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTracingFlushedOnSIGTERM runs the real gateway binary with
// [openshell.gateway.otlp] pointing at a real OTLP/gRPC receiver and a
// batch delay far longer than the test: the spans can only arrive through
// the flush after SIGTERM. The RPC's span carries the request id the
// client sent, and the store call is its child. The security event of the
// same gateway's authorization denial lands in the configured sink.
func TestTracingFlushedOnSIGTERM(t *testing.T) {
	rcv := telemetrytest.Start(t)
	events := filepath.Join(TempDir(t), "audit", "events.jsonl")
	g := Start(t, Options{
		ExtraArgs: []string{"--config", otlpConfig(t, rcv.Endpoint), "--security-event-sink", events},
		Env:       []string{"OTEL_BSP_SCHEDULE_DELAY=600000", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1"},
	})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "trace-e2e-req-1")
	if _, err := g.Client().ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{}); err != nil {
		t.Fatal(err)
	}
	// A user calling a sandbox-only RPC is denied: a security event.
	if _, err := g.Client().RefreshSandboxToken(t.Context(), &openshellv1.RefreshSandboxTokenRequest{}); err == nil {
		t.Fatal("RefreshSandboxToken as a user succeeded")
	}
	if got := len(rcv.Spans()); got != 0 {
		t.Fatalf("receiver got %d spans before SIGTERM; the test needs the batcher to hold them", got)
	}
	g.Stop()

	srv := rcv.WaitFor(t, 5*time.Second, "ListSandboxes with the request id", func(s telemetrytest.Span) bool {
		return s.Name == "openshell.v1.OpenShell/ListSandboxes" && s.Attrs[telemetry.AttrRequestID] == "trace-e2e-req-1"
	})
	if srv.Service != "gw-e2e" {
		t.Errorf("service.name = %q, want gw-e2e", srv.Service)
	}
	rcv.WaitFor(t, time.Second, "a store span under ListSandboxes", func(s telemetrytest.Span) bool {
		return strings.HasPrefix(s.Name, "store.") && s.ParentSpanID == srv.SpanID && s.TraceID == srv.TraceID
	})
	recov := rcv.WaitFor(t, time.Second, "lifecycle.Recover as its own root", func(s telemetrytest.Span) bool {
		return s.Name == "lifecycle.Recover" && s.ParentSpanID == ""
	})
	// The in-process driver's calls are children of their caller's span.
	rcv.WaitFor(t, time.Second, "compute.List of the process driver under lifecycle.Recover", func(s telemetrytest.Span) bool {
		return s.Name == "compute.List" && s.ParentSpanID == recov.SpanID && s.Attrs["openshell.compute.driver"] == "process"
	})

	data, recs := readSink(t, events)
	var found bool
	for _, r := range recs {
		if r.ClassUID == int(securityevent.HTTPActivity) && r.Action == "Denied" && r.API != nil && strings.HasSuffix(r.API.Operation, "/RefreshSandboxToken") && r.Actor != nil {
			found = true
		}
	}
	if !found {
		t.Errorf("no denied HTTP Activity event for RefreshSandboxToken in %s:\n%s", events, data)
	}
	if st, err := os.Stat(events); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("event file mode = %v (%v), want 0600", st.Mode().Perm(), err)
	}
}

// TestTracingCollectorUnreachable: with nobody listening at the endpoint
// the gateway starts, serves and stops within its flush deadline.
func TestTracingCollectorUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	g := Start(t, Options{ExtraArgs: []string{"--config", otlpConfig(t, dead)}})
	for range 5 {
		if _, err := g.Client().ListSandboxes(t.Context(), &openshellv1.ListSandboxesRequest{}); err != nil {
			t.Fatalf("ListSandboxes with an unreachable collector = %v", err)
		}
	}
	start := time.Now()
	g.Stop()
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("stop took %v with an unreachable collector", d)
	}
}

// TestTracingMalformedEndpointServes: a malformed endpoint is logged and
// export is off; the gateway serves.
func TestTracingMalformedEndpointServes(t *testing.T) {
	g := Start(t, Options{ExtraArgs: []string{"--config", otlpConfig(t, "otel-without-scheme:4317")}})
	if _, err := g.Client().ListSandboxes(t.Context(), &openshellv1.ListSandboxesRequest{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(g.Logs(), "OpenTelemetry trace export disabled") {
		t.Errorf("gateway log lacks the disabled-export line:\n%s", g.Logs())
	}
}

// TestSecurityEventsEndToEnd: the real gateway with a real sandbox writes
// exactly one event for the create and one for an exec whose arguments
// and environment carry a secret; the secret reaches neither the sink nor
// the sandbox's GetSandboxLogs, where its events also appear.
func TestSecurityEventsEndToEnd(t *testing.T) {
	const secret = "e2e-secret-6b1f0c"
	events := filepath.Join(TempDir(t), "events.jsonl")
	g := Start(t, Options{ExtraArgs: []string{"--security-event-sink", events}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "audited")
	id := sb.GetMetadata().GetId()
	if _, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{
		SandboxId: id, Command: []string{"/bin/sh", "-c", "test -n \"$1\"", "sh", secret},
		Environment: map[string]string{"API_TOKEN": secret},
	}); err != nil || code != 0 {
		t.Fatalf("Exec = exit %d, %v", code, err)
	}

	data, recs := readSink(t, events)
	if bytes.Contains(data, []byte(secret)) {
		t.Errorf("event sink contains the secret:\n%s", data)
	}
	count := map[string]int{}
	for _, r := range recs {
		if r.Unmapped["sandbox_id"] == id && r.API != nil {
			count[r.API.Operation+" "+r.Status]++
		}
	}
	want := map[string]int{
		"/openshell.v1.OpenShell/CreateSandbox Success": 1,
		"/openshell.v1.OpenShell/ExecSandbox Success":   1,
	}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("events %q = %d, want %d (all for the sandbox: %v)", k, count[k], n, count)
		}
	}
	logs, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Sources: []string{"gateway"}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range logs.GetLogs() {
		if l.GetTarget() == "security_event" {
			n++
			if strings.Contains(l.GetMessage(), secret) {
				t.Errorf("sandbox log line contains the secret: %s", l.GetMessage())
			}
		}
	}
	if n < 2 {
		t.Errorf("GetSandboxLogs has %d security_event lines, want the create and the exec", n)
	}
}
