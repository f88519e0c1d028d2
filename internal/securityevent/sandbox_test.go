package securityevent

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func decisionLine(target string, fields map[string]string) *openshellv1.SandboxLogLine {
	return &openshellv1.SandboxLogLine{SandboxId: "sb1", TimestampMs: 1700000000123, Target: target, Source: "sandbox", Fields: fields}
}

// sandboxRecords runs lines through FromSandboxLog and a Log, and returns
// the sink's records.
func sandboxRecords(t *testing.T, lines ...*openshellv1.SandboxLogLine) ([]Record, *Log) {
	t.Helper()
	var sink bytes.Buffer
	l, err := New(Options{Sink: &sink, Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		for _, ev := range FromSandboxLog(line) {
			ev.SandboxID = line.GetSandboxId()
			l.Emit(context.Background(), ev)
		}
	}
	var out []Record
	for _, b := range bytes.Split(bytes.TrimSpace(sink.Bytes()), []byte("\n")) {
		if len(b) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("sink line %q: %v", b, err)
		}
		out = append(out, r)
	}
	return out, l
}

// shape is what a test compares of a record (uid and time vary).
type shape struct {
	Class, Activity, Action, Disposition, Status, Severity, Product, Message, Detail string
	Actor                                                                            *Actor
	Dst                                                                              *Endpoint
	Rule                                                                             *FirewallRule
	HTTP                                                                             *HTTPRequest
	Resp                                                                             *HTTPResponse
	Finding                                                                          *FindingInfo
	Unmapped                                                                         map[string]string
}

func shapeOf(r Record) shape {
	return shape{
		Class: r.ClassName, Activity: r.ActivityName, Action: r.Action, Disposition: r.Disposition, Status: r.Status,
		Severity: r.Severity, Product: r.Metadata.Product.Name, Message: r.Message, Detail: r.StatusDetail,
		Actor: r.Actor, Dst: r.DstEndpoint, Rule: r.FirewallRule, HTTP: r.HTTPRequest, Resp: r.HTTPResponse,
		Finding: r.FindingInfo, Unmapped: r.Unmapped,
	}
}

func TestFromSandboxLog(t *testing.T) {
	curl := &Actor{Process: &Process{Name: "/usr/bin/curl", PID: 42}}
	for _, tc := range []struct {
		name   string
		line   *openshellv1.SandboxLogLine
		want   []shape
		counts map[string]float64 // class/outcome
	}{{
		name: "connect allowed",
		line: decisionLine(TargetEgress, map[string]string{"decision": "allow", "kind": "connect", "binary": "/usr/bin/curl", "pid": "42",
			"host": "api.example.com", "ip": "192.0.2.7", "port": "443", "policy": "github", "method": "", "path": "", "reason": "", "finding": ""}),
		want: []shape{{
			Class: "Network Activity", Activity: "Open", Action: "Allowed", Disposition: "Allowed", Status: "Success", Severity: "Informational",
			Product: SandboxProduct, Message: "CONNECT allow api.example.com:443", Actor: curl,
			Dst:      &Endpoint{Hostname: "api.example.com", IP: "192.0.2.7", Port: 443},
			Rule:     &FirewallRule{Name: "github", Type: "l4"},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "allow", "kind": "connect"},
		}},
		counts: map[string]float64{"Network Activity/success": 1},
	}, {
		name: "forward http denied by a rest rule, query cut",
		line: decisionLine(TargetEgress, map[string]string{"decision": "deny", "kind": "http", "binary": "/usr/bin/curl", "pid": "42",
			"host": "api.example.com", "port": "80", "policy": "api", "method": "POST", "path": "/repos/x?token=q", "reason": "POST /repos/x not permitted by policy"}),
		want: []shape{{
			Class: "HTTP Activity", Activity: "Post", Action: "Denied", Disposition: "Blocked", Status: "Failure", Severity: "Medium",
			Product: SandboxProduct, Message: "HTTP deny POST api.example.com:80/repos/x", Detail: "POST /repos/x not permitted by policy", Actor: curl,
			Dst:      &Endpoint{Hostname: "api.example.com", Port: 80},
			Rule:     &FirewallRule{Name: "api", Type: "l7"},
			HTTP:     &HTTPRequest{Method: "POST", URL: &URL{Hostname: "api.example.com", Path: "/repos/x", Port: 80}},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "deny", "kind": "http"},
		}},
		counts: map[string]float64{"HTTP Activity/denied": 1},
	}, {
		name: "audit",
		line: decisionLine(TargetEgress, map[string]string{"decision": "audit", "kind": "http", "binary": "/usr/bin/curl", "pid": "42",
			"host": "a.test", "port": "80", "policy": "api", "method": "GET", "path": "/x", "reason": "GET /x not permitted by policy"}),
		want: []shape{{
			Class: "HTTP Activity", Activity: "Get", Action: "Allowed", Disposition: "Logged", Status: "Success", Severity: "Informational",
			Product: SandboxProduct, Message: "HTTP audit GET a.test:80/x", Detail: "GET /x not permitted by policy", Actor: curl,
			Dst: &Endpoint{Hostname: "a.test", Port: 80}, Rule: &FirewallRule{Name: "api", Type: "l7"},
			HTTP:     &HTTPRequest{Method: "GET", URL: &URL{Hostname: "a.test", Path: "/x", Port: 80}},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "audit", "kind": "http"},
		}},
		counts: map[string]float64{"HTTP Activity/audited": 1},
	}, {
		name: "ssrf block: network activity and a detection finding",
		line: decisionLine(TargetEgress, map[string]string{"decision": "deny", "kind": "connect", "binary": "/usr/bin/curl", "pid": "42",
			"host": "internal.test", "port": "8080", "policy": "up", "finding": FindingSSRF,
			"reason": "address 127.0.0.1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"}),
		want: []shape{{
			Class: "Network Activity", Activity: "Open", Action: "Denied", Disposition: "Blocked", Status: "Failure", Severity: "Medium",
			Product: SandboxProduct, Message: "CONNECT deny internal.test:8080", Actor: curl,
			Detail: "address 127.0.0.1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips",
			Dst:    &Endpoint{Hostname: "internal.test", Port: 8080}, Rule: &FirewallRule{Name: "up", Type: "l4"},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "deny", "kind": "connect"},
		}, {
			Class: "Detection Finding", Activity: "Create", Action: "Denied", Disposition: "Blocked", Status: "Failure", Severity: "High",
			Product: SandboxProduct, Message: "Server-Side Request Forgery Blocked: CONNECT deny internal.test:8080", Actor: curl,
			Detail: "address 127.0.0.1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips",
			Dst:    &Endpoint{Hostname: "internal.test", Port: 8080}, Rule: &FirewallRule{Name: "up", Type: "l4"},
			Finding:  &FindingInfo{UID: FindingSSRF, Title: "Server-Side Request Forgery Blocked", Desc: "address 127.0.0.1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "deny", "kind": "connect"},
		}},
		counts: map[string]float64{"Network Activity/denied": 1, "Detection Finding/denied": 1},
	}, {
		name: "inference request with its status",
		line: decisionLine(TargetInference, map[string]string{"decision": "allow", "kind": "inference", "binary": "/usr/bin/curl", "pid": "42",
			"host": "inference.local", "method": "POST", "path": "/v1/chat/completions", "protocol": "openai_chat_completions", "upstream": "api.test", "status": "200"}),
		want: []shape{{
			Class: "HTTP Activity", Activity: "Post", Action: "Allowed", Disposition: "Allowed", Status: "Success", Severity: "Informational",
			Product: SandboxProduct, Message: "HTTP allow POST inference.local/v1/chat/completions", Actor: curl,
			Dst: &Endpoint{Hostname: "inference.local"}, Rule: &FirewallRule{Type: "inference"},
			HTTP: &HTTPRequest{Method: "POST", URL: &URL{Hostname: "inference.local", Path: "/v1/chat/completions"}},
			Resp: &HTTPResponse{Code: 200},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "allow", "kind": "inference",
				"protocol": "openai_chat_completions", "upstream": "api.test"},
		}},
		counts: map[string]float64{"HTTP Activity/success": 1},
	}, {
		name: "a placeholder is redacted",
		line: decisionLine(TargetEgress, map[string]string{"decision": "deny", "kind": "http", "host": "a.test", "port": "80", "method": "GET",
			"path": "/bot" + placeholderMarker + "env:KEY/send", "reason": "credential_endpoint_mismatch: credential is not authorized for this request endpoint",
			"finding": FindingCredentialMismatch}),
		want: []shape{{
			Class: "HTTP Activity", Activity: "Get", Action: "Denied", Disposition: "Blocked", Status: "Failure", Severity: "Medium",
			Product: SandboxProduct, Message: "HTTP deny GET a.test:80" + redacted,
			Detail:   "credential_endpoint_mismatch: credential is not authorized for this request endpoint",
			Dst:      &Endpoint{Hostname: "a.test", Port: 80},
			HTTP:     &HTTPRequest{Method: "GET", URL: &URL{Hostname: "a.test", Path: redacted, Port: 80}},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "deny", "kind": "http"},
		}, {
			Class: "Detection Finding", Activity: "Create", Action: "Denied", Disposition: "Blocked", Status: "Failure", Severity: "High",
			Product: SandboxProduct, Message: "Credential Endpoint Mismatch: HTTP deny GET a.test:80" + redacted,
			Detail:   "credential_endpoint_mismatch: credential is not authorized for this request endpoint",
			Dst:      &Endpoint{Hostname: "a.test", Port: 80},
			Finding:  &FindingInfo{UID: FindingCredentialMismatch, Title: "Credential Endpoint Mismatch", Desc: "credential_endpoint_mismatch: credential is not authorized for this request endpoint"},
			Unmapped: map[string]string{"sandbox_id": "sb1", "decision": "deny", "kind": "http"},
		}},
		counts: map[string]float64{"HTTP Activity/denied": 1, "Detection Finding/denied": 1},
	}, {
		name: "not a decision: other targets and lines without a decision",
		line: decisionLine("main_process", map[string]string{"decision": "deny", "kind": "connect"}),
	}, {
		name: "not a decision: egress line without a decision",
		line: decisionLine(TargetEgress, map[string]string{"addr": "127.0.0.1:3128"}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			recs, l := sandboxRecords(t, tc.line)
			var got []shape
			for _, r := range recs {
				got = append(got, shapeOf(r))
				if r.Time != 1700000000123 {
					t.Errorf("time = %d, want the supervisor's timestamp", r.Time)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			for k, want := range tc.counts {
				class, outcome, _ := strings.Cut(k, "/")
				if n := testutil.ToFloat64(l.total.WithLabelValues(class, outcome)); n != want {
					t.Errorf("openshell_security_events_total{class=%q,outcome=%q} = %v, want %v", class, outcome, n, want)
				}
			}
			if n := testutil.CollectAndCount(l.total); n != len(tc.counts) {
				t.Errorf("%d event series, want %d", n, len(tc.counts))
			}
		})
	}
}

// TestFromSandboxLogBounds: a pushed value is cut to maxSandboxField
// bytes, so a supervisor cannot grow the sink without bound per event.
func TestFromSandboxLogBounds(t *testing.T) {
	long := strings.Repeat("h", 10*maxSandboxField)
	evs := FromSandboxLog(decisionLine(TargetEgress, map[string]string{"decision": "deny", "kind": "connect", "host": long, "reason": long}))
	if len(evs) != 1 || len(evs[0].Dst.Hostname) != maxSandboxField || len(evs[0].StatusDetail) != maxSandboxField {
		t.Fatalf("FromSandboxLog(long values) = %+v, want one event with values cut to %d bytes", evs, maxSandboxField)
	}
}
