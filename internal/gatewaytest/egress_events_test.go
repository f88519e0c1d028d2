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
	curl, port, portN := egressUpstream(t)
	events := filepath.Join(TempDir(t), "events.jsonl")
	g := Start(t, Options{
		Env:       []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,other.egress.test=127.0.0.1,internal.egress.test=127.0.0.1"},
		ExtraArgs: []string{"--security-event-sink", events},
	})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}},
				{Host: "internal.egress.test", Port: portN}, // loopback without allowed_ips: SSRF guard
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}},
		},
	})
	id := createEgressSandbox(ctx, t, c, "egress-events", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "egress-events", "")
	sh := func(script, want string) {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		if got := strings.TrimSpace(out); got != want {
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
		data, err := os.ReadFile(events)
		if err != nil {
			t.Fatal(err)
		}
		got, recs = map[key]int{}, nil
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			var r securityevent.Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("event line %q: %v", line, err)
			}
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
		all := true
		for k := range want {
			all = all && got[k] > 0
		}
		if all || time.Now().After(deadline) {
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

	data, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
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
	for _, s := range []string{headerSecret, querySecret, "PLANTED_KEY", "openshell:resolve:"} {
		if bytes.Contains(data, []byte(s)) {
			t.Errorf("the event sink or the sandbox's logs contain %q", s)
		}
	}
}

// waitSandboxEvent polls the security event sink at path for up to 30 s
// for a record of a sandbox's supervisor that match accepts.
func waitSandboxEvent(t testing.TB, path string, match func(securityevent.Record) bool) securityevent.Record {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			var r securityevent.Record
			if json.Unmarshal(line, &r) == nil && r.Metadata.Product.Name == securityevent.SandboxProduct && match(r) {
				return r
			}
		}
	}
	t.Fatalf("no matching sandbox event in %s within 30s", path)
	return securityevent.Record{}
}
