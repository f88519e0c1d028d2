package securityevent

import (
	"strconv"
	"strings"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Targets of the supervisor's decision lines (PushSandboxLogs): one line
// per egress proxy decision (a CONNECT tunnel or a forward HTTP request)
// and per inference.local request.
const (
	TargetEgress    = "openshell_sandbox::egress"
	TargetInference = "openshell_sandbox::inference"
)

// SandboxProduct is the metadata product name of events a sandbox's
// supervisor observed.
const SandboxProduct = "openshell-sandbox"

// Findings a decision line can name in its "finding" field.
const (
	// FindingSSRF: the SSRF guard refused a destination (an internal,
	// the gateway's own or a cloud metadata address or name).
	FindingSSRF = "ssrf_blocked"
	// FindingCredentialMismatch: a credential placeholder was sent to an
	// endpoint its provider does not cover.
	FindingCredentialMismatch = "credential_endpoint_mismatch"
)

var findingTitles = map[string]string{
	FindingSSRF:               "Server-Side Request Forgery Blocked",
	FindingCredentialMismatch: "Credential Endpoint Mismatch",
}

const (
	maxSandboxField   = 512 // bytes of one pushed value kept
	placeholderMarker = "openshell:resolve:"
	redacted          = "[REDACTED]"
)

// httpActivities are OCSF HTTP Activity ids by request method.
var httpActivities = map[string]Activity{
	"CONNECT": {1, "Connect"}, "DELETE": {2, "Delete"}, "GET": {3, "Get"}, "HEAD": {4, "Head"},
	"OPTIONS": {5, "Options"}, "POST": {6, "Post"}, "PUT": {7, "Put"}, "TRACE": {8, "Trace"}, "PATCH": {9, "Patch"},
}

// FromSandboxLog turns a decision line a sandbox's supervisor pushed into
// its security events: one Network Activity (kind connect) or HTTP
// Activity (kind http, inference) event, plus a Detection Finding when the
// line names one (an SSRF block, a credential endpoint mismatch). Other
// lines yield none. The events carry the decision's identifiers only:
// binary, pid, host, address, port, policy rule, method, path without
// query, status and reason, each bounded, with any credential placeholder
// redacted. The caller sets SandboxID (the authenticated sandbox).
func FromSandboxLog(l *openshellv1.SandboxLogLine) []Event {
	if l.GetTarget() != TargetEgress && l.GetTarget() != TargetInference {
		return nil
	}
	f := l.GetFields()
	get := func(k string) string { return clean(f[k]) }
	var outcome Outcome
	switch get("decision") {
	case "allow":
		outcome = Success
	case "deny":
		outcome = Denied
	case "audit":
		outcome = Audited
	default:
		return nil
	}
	kind := get("kind")
	ev := Event{
		Class: NetworkActivity, Activity: ActivityOpen, Outcome: outcome,
		Product:      SandboxProduct,
		StatusDetail: get("reason"),
		Fields:       map[string]string{"decision": get("decision"), "kind": kind, "upstream": get("upstream"), "protocol": get("protocol")},
	}
	if l.GetTimestampMs() > 0 {
		ev.Time = time.UnixMilli(l.GetTimestampMs())
	}
	if b := get("binary"); b != "" {
		ev.Process = &Process{Name: b, PID: atoi(get("pid"))}
	}
	host, port := get("host"), atoi(get("port"))
	if host != "" || get("ip") != "" {
		ev.Dst = &Endpoint{Hostname: host, IP: get("ip"), Port: port}
	}
	ruleType := "l4"
	switch {
	case kind == "inference":
		ruleType = "inference"
	case get("path") != "":
		ruleType = "l7"
	}
	if p := get("policy"); p != "" || kind == "inference" {
		ev.Rule = &FirewallRule{Name: p, Type: ruleType}
	}
	method, path := strings.ToUpper(get("method")), stripQuery(get("path"))
	switch kind {
	case "connect":
		ev.Message = "CONNECT " + get("decision") + " " + hostPort(host, port)
	case "http", "inference":
		ev.Class = HTTPActivity
		ev.Activity = ActivityOther("Other")
		if a, ok := httpActivities[method]; ok {
			ev.Activity = a
		}
		ev.HTTP = &HTTPRequest{Method: method, URL: &URL{Hostname: host, Path: path, Port: port}}
		ev.HTTPStatus = atoi(get("status"))
		ev.Message = "HTTP " + get("decision") + " " + method + " " + hostPort(host, port) + path
	default:
		return nil
	}
	out := []Event{ev}
	if title, ok := findingTitles[get("finding")]; ok && outcome == Denied {
		fe := ev
		fe.Class, fe.Activity = DetectionFinding, ActivityCreate
		fe.Finding = &FindingInfo{UID: get("finding"), Title: title, Desc: ev.StatusDetail}
		fe.Message = title + ": " + ev.Message
		fe.HTTP, fe.HTTPStatus = nil, 0
		out = append(out, fe)
	}
	return out
}

func hostPort(host string, port int) string {
	if port == 0 {
		return host
	}
	return host + ":" + strconv.Itoa(port)
}

// clean bounds a pushed value and redacts credential placeholders (the
// supervisor never sends them; this is defense in depth).
func clean(s string) string {
	if len(s) > maxSandboxField {
		s = s[:maxSandboxField]
	}
	if strings.Contains(s, placeholderMarker) {
		return redacted
	}
	return s
}

// stripQuery cuts a path at its query or fragment.
func stripQuery(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
