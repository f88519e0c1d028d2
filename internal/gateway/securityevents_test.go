package gateway

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// TestSecurityEventsInSandboxLogs: an event whose subject is a sandbox is
// also a gateway log line of that sandbox (GetSandboxLogs); others are not.
func TestSecurityEventsInSandboxLogs(t *testing.T) {
	logs := sandboxlog.New(0)
	l, closeSink, err := openSecurityEvents(config.SecurityEvents{}, logs, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink()
	l.Emit(context.Background(), securityevent.Event{Class: securityevent.ProcessActivity, Activity: securityevent.ActivityLaunch, Outcome: securityevent.Denied, SandboxID: "sb1", Message: "exec: denied"})
	l.Emit(context.Background(), securityevent.Event{Class: securityevent.HTTPActivity, Activity: securityevent.ActivityPost, Outcome: securityevent.Denied})
	lines, _ := logs.Read("sb1", sandboxlog.Filter{})
	if len(lines) != 1 {
		t.Fatalf("sandbox sb1 has %d log lines, want 1: %v", len(lines), lines)
	}
	ln := lines[0]
	if ln.GetSource() != sandboxlog.SourceGateway || ln.GetTarget() != "security_event" || ln.GetLevel() != "warn" ||
		!strings.Contains(ln.GetMessage(), `"class_uid":1007`) || !strings.Contains(ln.GetMessage(), `"sandbox_id":"sb1"`) {
		t.Errorf("log line = %v", ln)
	}
}

func TestSecurityEventSinkRelativePathRefused(t *testing.T) {
	if _, _, err := openSecurityEvents(config.SecurityEvents{Sink: "rel.jsonl", MaxSizeMB: 1, MaxFiles: 1}, sandboxlog.New(0), nil); err == nil {
		t.Fatal("openSecurityEvents(relative sink) = nil error")
	}
}
