package securityevent

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
)

// OCSFVersion is the OCSF schema version the events are shaped after.
const OCSFVersion = "1.8.0"

// Class is an OCSF event class uid.
type Class int

// The classes the gateway emits.
const (
	ProcessActivity   Class = 1007 // sandbox create, delete, adopt, stop, start; exec
	DetectionFinding  Class = 2004 // rate limit exceeded; SSRF blocks and credential endpoint mismatches in a sandbox
	NetworkActivity   Class = 4001 // TCP forwards to a sandbox port; a sandbox's CONNECT tunnels
	HTTPActivity      Class = 4002 // authentication failures, authorization denials, token issuance; a sandbox's forward HTTP requests
	SSHActivity       Class = 4007 // SSH sessions (ForwardTcp to the sandbox's SSH server)
	ConfigStateChange Class = 5019 // policy, settings, providers, workspaces and members
)

type classInfo struct {
	name         string
	categoryUID  int
	categoryName string
}

var classes = map[Class]classInfo{
	ProcessActivity:   {"Process Activity", 1, "System Activity"},
	DetectionFinding:  {"Detection Finding", 2, "Findings"},
	NetworkActivity:   {"Network Activity", 4, "Network Activity"},
	HTTPActivity:      {"HTTP Activity", 4, "Network Activity"},
	SSHActivity:       {"SSH Activity", 4, "Network Activity"},
	ConfigStateChange: {"Device Config State Change", 5, "Discovery"},
}

// String returns the OCSF class name.
func (c Class) String() string { return classes[c].name }

// Activity is an OCSF activity of a class (id and name).
type Activity struct {
	ID   int
	Name string
}

// Activities used by the gateway (OCSF activity ids of their classes).
var (
	ActivityLaunch    = Activity{1, "Launch"}    // Process Activity
	ActivityTerminate = Activity{2, "Terminate"} // Process Activity
	ActivityOpen      = Activity{1, "Open"}      // Network / SSH Activity
	ActivityRefuse    = Activity{5, "Refuse"}    // Network Activity
	ActivityPost      = Activity{6, "Post"}      // HTTP Activity (gRPC is an HTTP/2 POST)
	ActivityLog       = Activity{1, "Log"}       // Device Config State Change
	ActivityCreate    = Activity{1, "Create"}    // Detection Finding
)

// ActivityOther is OCSF's "Other" (99) with a specific name.
func ActivityOther(name string) Activity { return Activity{99, name} }

// Outcome is what became of the action.
type Outcome string

// Outcomes. Denied covers Unauthenticated and PermissionDenied, and a
// sandbox egress denial; Audited is a sandbox REST request that broke a
// rule in audit mode: logged and let through.
const (
	Success Outcome = "success"
	Failure Outcome = "failure"
	Denied  Outcome = "denied"
	Audited Outcome = "audited"
)

// Event is one security event before serialization. Fields holds extra
// identifiers (see the keys documented in docs/observability.md); callers
// must never put secrets, tokens, values or bodies there.
type Event struct {
	Class    Class
	Activity Activity
	Outcome  Outcome
	// Code is the gRPC status code name ("OK", "PermissionDenied").
	Code    string
	Message string
	// Method is the full gRPC method name.
	Method    string
	RequestID string
	// ActorSubject and ActorKind ("user", "sandbox") name the principal;
	// empty when the caller was not authenticated.
	ActorSubject string
	ActorKind    string
	SourceIP     string
	SandboxID    string
	SandboxName  string
	Workspace    string
	Fields       map[string]string
	Time         time.Time

	// The fields below describe what a sandbox's supervisor observed
	// (egress decisions, see FromSandboxLog); the gateway's own events
	// leave them unset.

	// Product names the component that observed the event; "" is the
	// gateway.
	Product string
	// Process is the acting process (OCSF actor.process).
	Process *Process
	// Dst is the destination (OCSF dst_endpoint).
	Dst *Endpoint
	// Rule is the policy rule that decided (OCSF firewall_rule).
	Rule *FirewallRule
	// HTTP is the request of HTTP Activity: method and path, never the
	// query, headers or body.
	HTTP *HTTPRequest
	// HTTPStatus is the response code when one is known (0: none).
	HTTPStatus int
	// Finding describes a Detection Finding.
	Finding *FindingInfo
	// StatusDetail is the reason for the outcome.
	StatusDetail string
}

// Emitter records security events. Emit never blocks on the caller's
// behalf for long and never fails: a lost event is counted, not returned.
type Emitter interface {
	Emit(ctx context.Context, ev Event)
}

// Discard drops every event.
var Discard Emitter = discard{}

type discard struct{}

func (discard) Emit(context.Context, Event) {}

// Record is the JSON form of an event (one line in the sink).
type Record struct {
	Time         int64  `json:"time"`
	ClassUID     int    `json:"class_uid"`
	ClassName    string `json:"class_name"`
	CategoryUID  int    `json:"category_uid"`
	CategoryName string `json:"category_name"`
	ActivityID   int    `json:"activity_id"`
	ActivityName string `json:"activity_name"`
	TypeUID      int    `json:"type_uid"`
	TypeName     string `json:"type_name"`
	SeverityID   int    `json:"severity_id"`
	Severity     string `json:"severity"`
	StatusID     int    `json:"status_id"`
	Status       string `json:"status"`
	StatusCode   string `json:"status_code,omitempty"`
	StatusDetail string `json:"status_detail,omitempty"`
	ActionID     int    `json:"action_id"`
	Action       string `json:"action"`
	// DispositionID and Disposition (OCSF security control profile):
	// Allowed (1), Blocked (2) or Logged (17); absent for a failure.
	DispositionID int               `json:"disposition_id,omitempty"`
	Disposition   string            `json:"disposition,omitempty"`
	Message       string            `json:"message"`
	Metadata      Metadata          `json:"metadata"`
	Actor         *Actor            `json:"actor,omitempty"`
	SrcEndpoint   *Endpoint         `json:"src_endpoint,omitempty"`
	DstEndpoint   *Endpoint         `json:"dst_endpoint,omitempty"`
	FirewallRule  *FirewallRule     `json:"firewall_rule,omitempty"`
	HTTPRequest   *HTTPRequest      `json:"http_request,omitempty"`
	HTTPResponse  *HTTPResponse     `json:"http_response,omitempty"`
	FindingInfo   *FindingInfo      `json:"finding_info,omitempty"`
	API           *API              `json:"api,omitempty"`
	Unmapped      map[string]string `json:"unmapped,omitempty"`
}

// Metadata is OCSF metadata: event uid and the request id as correlation uid.
type Metadata struct {
	Version        string  `json:"version"`
	UID            string  `json:"uid"`
	CorrelationUID string  `json:"correlation_uid,omitempty"`
	Product        Product `json:"product"`
}

// Product names the emitter.
type Product struct {
	Name       string `json:"name"`
	VendorName string `json:"vendor_name"`
	Version    string `json:"version,omitempty"`
}

// Actor is the authenticated principal (user) or, for what a sandbox
// observed, the process that acted.
type Actor struct {
	User    *User    `json:"user,omitempty"`
	Process *Process `json:"process,omitempty"`
}

// Process is an OCSF process: the executable's path and the pid.
type Process struct {
	Name string `json:"name"`
	PID  int    `json:"pid,omitempty"`
}

// User is an OCSF user: uid is the principal subject, type its kind.
type User struct {
	UID  string `json:"uid"`
	Type string `json:"type,omitempty"`
}

// Endpoint is a network endpoint: the caller's address (src_endpoint),
// or a destination's host name, address and port (dst_endpoint).
type Endpoint struct {
	Hostname string `json:"hostname,omitempty"`
	IP       string `json:"ip,omitempty"`
	Port     int    `json:"port,omitempty"`
}

// FirewallRule is the policy rule that decided: the network policy rule's
// name and its type ("l4": host, port and binary; "l7": a REST rule;
// "inference": the inference router).
type FirewallRule struct {
	Name string `json:"name,omitempty"`
	Type string `json:"type"`
}

// HTTPRequest is an OCSF HTTP request: method and URL without a query.
type HTTPRequest struct {
	Method string `json:"http_method,omitempty"`
	URL    *URL   `json:"url,omitempty"`
}

// URL is an OCSF URL; it never carries a query string.
type URL struct {
	Hostname string `json:"hostname,omitempty"`
	Path     string `json:"path,omitempty"`
	Port     int    `json:"port,omitempty"`
}

// HTTPResponse is an OCSF HTTP response: the status code.
type HTTPResponse struct {
	Code int `json:"code"`
}

// FindingInfo is an OCSF finding: a stable identifier of the kind of
// detection, a title and a description.
type FindingInfo struct {
	UID   string `json:"uid"`
	Title string `json:"title"`
	Desc  string `json:"desc,omitempty"`
}

// API names the RPC.
type API struct {
	Operation string `json:"operation"`
}

// Options configure a Log.
type Options struct {
	// Sink receives the JSON lines; nil keeps counting without writing.
	Sink io.Writer
	// Registerer receives the counters; nil = not registered.
	Registerer prometheus.Registerer
	// Version is the product version in metadata.
	Version string
	// OnSandboxEvent, when set, is called with every event whose subject
	// is a sandbox (SandboxID set) and its JSON line, e.g. to show it in
	// GetSandboxLogs. It must not block.
	OnSandboxEvent func(sandboxID string, line []byte, ev Event)
	// Now is the clock; nil = time.Now.
	Now func() time.Time
	// Product names the emitter in metadata.product of its own events
	// (the summaries of suppressed events included); "" is
	// "openshell-gateway" with Version.
	Product string

	// SandboxRate and SandboxBurst limit the events a sandbox's
	// supervisor reports (Product SandboxProduct), per sandbox: a token
	// bucket refilled at SandboxRate events per second holding up to
	// SandboxBurst. An event over the limit is counted in
	// openshell_security_events_dropped_total{reason="rate_limited"} and
	// not written; one Detection Finding per SummaryInterval and sandbox
	// (uid FindingEventsSuppressed) says how many were. Zero values are
	// the defaults (DefaultSandboxRate, DefaultSandboxBurst,
	// DefaultSummaryInterval); a negative SandboxRate turns the limit off.
	// The gateway's own events are never limited.
	SandboxRate     float64
	SandboxBurst    int
	SummaryInterval time.Duration
}

// Log is the Emitter that writes JSON lines and counts events.
type Log struct {
	o       Options
	mu      sync.Mutex
	total   *prometheus.CounterVec
	dropped *prometheus.CounterVec
	limit   *sandboxLimiter // nil: no limit
}

var _ Emitter = (*Log)(nil)

// New returns a Log; it fails only when the counters cannot be registered.
func New(o Options) (*Log, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	l := &Log{
		o: o,
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_security_events_total",
			Help: "Security events recorded by the gateway (its own and the egress decisions its sandboxes report), by OCSF class and outcome.",
		}, []string{"class", "outcome"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_security_events_dropped_total",
			Help: "Security events not written: the sink failed (reason sink_error) or a sandbox reported more than its rate limit (reason rate_limited).",
		}, []string{"reason"}),
	}
	for _, r := range []string{DropSinkError, DropRateLimited} {
		l.dropped.WithLabelValues(r)
	}
	if o.SandboxRate >= 0 {
		rate, burst, every := o.SandboxRate, o.SandboxBurst, o.SummaryInterval
		if rate == 0 {
			rate = DefaultSandboxRate
		}
		if burst <= 0 {
			burst = DefaultSandboxBurst
		}
		if every <= 0 {
			every = DefaultSummaryInterval
		}
		l.limit = &sandboxLimiter{
			rate: rate, burst: float64(burst), interval: every, now: o.Now,
			buckets: map[string]*bucket{},
			summary: func(sandboxID string, n int) {
				l.Emit(context.Background(), summaryEvent(sandboxID, n, rate, burst, every))
			},
		}
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{l.total, l.dropped} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// Emit counts ev and writes it to the sink.
func (l *Log) Emit(_ context.Context, ev Event) {
	if l.limit != nil && ev.Product == SandboxProduct && !l.limit.allow(ev.SandboxID) {
		l.dropped.WithLabelValues(DropRateLimited).Inc()
		return
	}
	if ev.Time.IsZero() {
		ev.Time = l.o.Now()
	}
	l.total.WithLabelValues(ev.Class.String(), string(ev.Outcome)).Inc()
	if l.o.Sink == nil && l.o.OnSandboxEvent == nil {
		return
	}
	line, err := json.Marshal(l.record(ev))
	if err != nil {
		l.dropped.WithLabelValues(DropSinkError).Inc()
		return
	}
	line = append(line, '\n')
	if l.o.Sink != nil {
		l.mu.Lock()
		_, err = l.o.Sink.Write(line)
		l.mu.Unlock()
		if err != nil {
			l.dropped.WithLabelValues(DropSinkError).Inc()
		}
	}
	if l.o.OnSandboxEvent != nil && ev.SandboxID != "" {
		l.o.OnSandboxEvent(ev.SandboxID, line[:len(line)-1], ev)
	}
}

// outcomeIDs are the OCSF ids and names an outcome maps to.
type outcomeIDs struct {
	sevID, statusID, actionID, dispID int
	sev, status, action, disp         string
}

// idsOf returns the severity, status, action and disposition of an
// outcome in class c.
func idsOf(o Outcome, c Class) outcomeIDs {
	var ids outcomeIDs
	switch o {
	case Success:
		ids = outcomeIDs{1, 1, 1, 1, "Informational", "Success", "Allowed", "Allowed"}
	case Denied:
		ids = outcomeIDs{3, 2, 2, 2, "Medium", "Failure", "Denied", "Blocked"}
	case Audited:
		ids = outcomeIDs{1, 1, 1, 17, "Informational", "Success", "Allowed", "Logged"}
	default:
		ids = outcomeIDs{2, 2, 1, 0, "Low", "Failure", "Allowed", ""}
	}
	if c == DetectionFinding {
		ids.sevID, ids.sev = 4, "High"
	}
	return ids
}

func (l *Log) record(ev Event) Record {
	ci := classes[ev.Class]
	ids := idsOf(ev.Outcome, ev.Class)
	product := Product{Name: ev.Product, VendorName: "openshell-go"}
	switch {
	case ev.Product == "" && l.o.Product != "":
		product.Name = l.o.Product
	case ev.Product == "":
		product.Name, product.Version = "openshell-gateway", l.o.Version
	}
	r := Record{
		Time: ev.Time.UnixMilli(), ClassUID: int(ev.Class), ClassName: ci.name,
		CategoryUID: ci.categoryUID, CategoryName: ci.categoryName,
		ActivityID: ev.Activity.ID, ActivityName: ev.Activity.Name,
		TypeUID: int(ev.Class)*100 + ev.Activity.ID, TypeName: ci.name + ": " + ev.Activity.Name,
		SeverityID: ids.sevID, Severity: ids.sev, StatusID: ids.statusID, Status: ids.status, StatusCode: ev.Code,
		StatusDetail: ev.StatusDetail, ActionID: ids.actionID, Action: ids.action,
		DispositionID: ids.dispID, Disposition: ids.disp, Message: ev.Message,
		Metadata: Metadata{
			Version: OCSFVersion, UID: uuid.NewString(), CorrelationUID: ev.RequestID,
			Product: product,
		},
		DstEndpoint: ev.Dst, FirewallRule: ev.Rule, HTTPRequest: ev.HTTP, FindingInfo: ev.Finding,
	}
	if ev.ActorSubject != "" {
		r.Actor = &Actor{User: &User{UID: ev.ActorSubject, Type: ev.ActorKind}}
	}
	if ev.Process != nil {
		if r.Actor == nil {
			r.Actor = &Actor{}
		}
		r.Actor.Process = ev.Process
	}
	if ev.HTTPStatus != 0 {
		r.HTTPResponse = &HTTPResponse{Code: ev.HTTPStatus}
	}
	if ev.SourceIP != "" {
		r.SrcEndpoint = &Endpoint{IP: ev.SourceIP}
	}
	if ev.Method != "" {
		r.API = &API{Operation: ev.Method}
	}
	um := map[string]string{}
	for k, v := range ev.Fields {
		if v != "" {
			um[k] = v
		}
	}
	for k, v := range map[string]string{"sandbox_id": ev.SandboxID, "sandbox_name": ev.SandboxName, "workspace": ev.Workspace} {
		if v != "" {
			um[k] = v
		}
	}
	if len(um) > 0 {
		r.Unmapped = um
	}
	return r
}
