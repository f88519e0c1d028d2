package gatewaytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// TestEgressSecurityEvents: a real gateway with a security event sink and a
// real sandbox whose policy lets curl reach allowed.test. The supervisor's
// egress decisions reach the gateway's sink through PushSandboxLogs, one
// event each, with the sandbox as subject: an allowed forward HTTP request
// (HTTP Activity), a denied one and a denied CONNECT to another host (HTTP
// and Network Activity), and an SSRF block (HTTP Activity plus a Detection
// Finding). A header secret, a query string and a credential placeholder
// the requests carry reach neither the sink nor GetSandboxLogs.
func TestEgressSecurityEvents(t *testing.T) {
	const (
		headerSecret = "planted-header-secret-51c2"
		querySecret  = "planted-query-secret-8e0d"
		placeholder  = "openshell:resolve:env:PLANTED_KEY"
	)
	ctx, s := startEventSandbox(t, "egress-events",
		[]string{"other.egress.test"},    // resolved to loopback, matches no rule
		[]string{"internal.egress.test"}) // in the rule without allowed_ips: SSRF guard
	c, id, curl, port, portN, events := s.c, s.id, s.curl, s.port, s.portN, s.events
	sh := func(script, want string) {
		t.Helper()
		if got := strings.TrimSpace(s.sh(ctx, t, script)); got != want {
			t.Fatalf("%s = %q, want %q", script, got, want)
		}
	}
	sh(fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}' -H 'Authorization: Bearer %s' 'http://allowed.test:%s/ok?token=%s'", curl, headerSecret, port, querySecret), "200")
	sh(fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}' -H 'X-Key: %s' 'http://other.egress.test:%s/bot%s/send?key=%s'", curl, placeholder, port, placeholder, placeholder), "403")
	sh(fmt.Sprintf("%s -s -p -o /dev/null -w '%%{http_connect}' 'http://other.egress.test:%s/'", curl, port), "403")
	sh(fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}' 'http://internal.egress.test:%s/'", curl, port), "403")

	type key struct{ class, action, host, finding string }
	want := map[key]int{
		{"HTTP Activity", "Allowed", "allowed.test", ""}:                                   1,
		{"HTTP Activity", "Denied", "other.egress.test", ""}:                               1,
		{"Network Activity", "Denied", "other.egress.test", ""}:                            1,
		{"HTTP Activity", "Denied", "internal.egress.test", ""}:                            1,
		{"Detection Finding", "Denied", "internal.egress.test", securityevent.FindingSSRF}: 1,
	}
	var got map[key]int
	var recs []securityevent.Record
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, all := readSink(t, events)
		got, recs = map[key]int{}, nil
		for _, r := range all {
			if r.Metadata.Product.Name != securityevent.SandboxProduct {
				continue
			}
			recs = append(recs, r)
			k := key{class: r.ClassName, action: r.Action}
			if r.DstEndpoint != nil {
				k.host = r.DstEndpoint.Hostname
			}
			if r.FindingInfo != nil {
				k.finding = r.FindingInfo.UID
			}
			got[k]++
		}
		seen := true
		for k := range want {
			seen = seen && got[k] > 0
		}
		if seen || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("events %+v = %d, want %d (all sandbox events: %v)", k, got[k], n, got)
		}
	}
	for _, r := range recs {
		if r.Unmapped["sandbox_id"] != id {
			t.Errorf("event subject = %q, want the sandbox %s: %+v", r.Unmapped["sandbox_id"], id, r)
		}
		if r.Actor == nil || r.Actor.Process == nil || r.Actor.Process.Name != curl || r.Actor.Process.PID <= 0 {
			t.Errorf("event actor = %+v, want curl (%s) with its pid", r.Actor, curl)
		}
		if r.DstEndpoint == nil || r.DstEndpoint.Port != int(portN) {
			t.Errorf("event destination = %+v, want port %d", r.DstEndpoint, portN)
			continue
		}
		// other.egress.test matches no rule; the others match "upstream".
		if matched := r.FirewallRule != nil && r.FirewallRule.Name == "upstream"; matched == (r.DstEndpoint.Hostname == "other.egress.test") {
			t.Errorf("event to %s has rule %+v", r.DstEndpoint.Hostname, r.FirewallRule)
		}
		switch r.Action {
		case "Allowed":
			if r.DstEndpoint.IP != "127.0.0.1" || r.HTTPRequest == nil || r.HTTPRequest.Method != "GET" || r.Disposition != "Allowed" {
				t.Errorf("allowed event = %+v, want address 127.0.0.1, method GET, disposition Allowed", r)
			}
		case "Denied":
			if r.StatusDetail == "" || r.Disposition != "Blocked" {
				t.Errorf("denied event = %+v, want a reason and disposition Blocked", r)
			}
		}
	}

	data, _ := readSink(t, events)
	logs, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	shown := 0
	for _, l := range logs.GetLogs() {
		if l.GetTarget() == "security_event" && strings.Contains(l.GetMessage(), `"name":"`+securityevent.SandboxProduct+`"`) {
			shown++
		}
		data = append(data, fmt.Sprint(l.GetMessage(), l.GetFields())...)
	}
	if shown != len(recs) {
		t.Errorf("GetSandboxLogs shows %d sandbox security events, the sink has %d", shown, len(recs))
	}
	for _, secret := range []string{headerSecret, querySecret, "PLANTED_KEY", "openshell:resolve:"} {
		if bytes.Contains(data, []byte(secret)) {
			t.Errorf("the event sink or the sandbox's logs contain %q", secret)
		}
	}
}

// eventSandbox is a real gateway writing security events to a sink file
// and a READY sandbox (running sleep) whose policy rule "upstream" lets
// curl reach allowed.test on a loopback upstream's port.
type eventSandbox struct {
	c      openshellv1.OpenShellClient
	id     string
	curl   string // the host's curl, the rule's one binary
	port   string // the upstream's port
	portN  uint32
	events string // the sink file
}

// startEventSandbox starts an eventSandbox named name. The test hosts
// allowed.test, denied and guarded resolve to 127.0.0.1; the rule allows
// allowed.test with allowed_ips 127.0.0.1 and guarded without, so the
// SSRF guard blocks those. The returned context ends after 3 minutes.
func startEventSandbox(t *testing.T, name string, denied, guarded []string) (context.Context, *eventSandbox) {
	t.Helper()
	s := &eventSandbox{events: filepath.Join(TempDir(t), "events.jsonl")}
	s.curl, s.port, s.portN = egressUpstream(t)
	hosts := []string{"allowed.test=127.0.0.1"}
	endpoints := []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: s.portN, AllowedIps: []string{"127.0.0.1"}}}
	for _, h := range denied {
		hosts = append(hosts, h+"=127.0.0.1")
	}
	for _, h := range guarded {
		hosts = append(hosts, h+"=127.0.0.1")
		endpoints = append(endpoints, &sandboxv1.NetworkEndpoint{Host: h, Port: s.portN})
	}
	g := Start(t, Options{
		Env:       []string{"OPENSHELL_EGRESS_TEST_HOSTS=" + strings.Join(hosts, ",")},
		ExtraArgs: []string{"--security-event-sink", s.events},
	})
	s.c = g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {Endpoints: endpoints, Binaries: []*sandboxv1.NetworkBinary{{Path: s.curl}}},
	})
	s.id = createEgressSandbox(ctx, t, s.c, name, &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, s.c, name, "")
	return ctx, s
}

// sh runs script with sh -c in the sandbox and returns its standard
// output, failing the test when the exec fails.
func (s *eventSandbox) sh(ctx context.Context, t testing.TB, script string) string {
	t.Helper()
	out, errOut, _, err := Exec(ctx, t, s.c, &openshellv1.ExecSandboxRequest{SandboxId: s.id, Command: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
	}
	return out
}

// readSink reads the security event sink at path and returns all of it
// and the records of its complete lines (a line still being written is
// left for the next read). A complete line that is not a record fails
// the test.
func readSink(t testing.TB, path string) ([]byte, []securityevent.Record) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []securityevent.Record
	for line := range bytes.Lines(data[:bytes.LastIndexByte(data, '\n')+1]) {
		var r securityevent.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("event line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return data, recs
}

// waitSandboxEvent polls the security event sink at path for up to 30 s
// for a record of a sandbox's supervisor that match accepts.
func waitSandboxEvent(t testing.TB, path string, match func(securityevent.Record) bool) securityevent.Record {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, recs := readSink(t, path)
		for _, r := range recs {
			if r.Metadata.Product.Name == securityevent.SandboxProduct && match(r) {
				return r
			}
		}
	}
	t.Fatalf("no matching sandbox event in %s within 30s", path)
	return securityevent.Record{}
}
