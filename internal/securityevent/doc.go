// Package securityevent writes the gateway's security audit trail: one
// structured event per security-relevant action (authentication failures,
// authorization denials, sandbox lifecycle, exec, SSH sessions and TCP
// forwards, policy, settings, provider and membership changes, token
// issuance), shaped after OCSF v1.8 classes as OpenShell uses them
// (Process Activity, Detection Finding, Network Activity, HTTP Activity,
// SSH Activity, Device Config State Change).
//
// Events are JSON lines written to a Sink (standard output or a size-rotated
// file, see OpenSink) and counted in openshell_security_events_total by
// class and outcome. An event carries identifiers only (method, request id,
// principal subject, sandbox id and name, workspace, setting key, provider
// name, port): never tokens, credentials, placeholders, setting values,
// command arguments, environments or request bodies.
//
// The gateway's gRPC interceptor produces the events from a table of RPCs
// (see ObserveRPC); the log service turns the egress and inference decision
// lines a sandbox's supervisor pushes into events whose subject is that
// sandbox (see FromSandboxLog: Network Activity, HTTP Activity and
// Detection Findings for SSRF blocks and credential endpoint mismatches);
// other code emits through the Emitter interface. A Log is safe
// for concurrent use; a write error drops the event and counts it in
// openshell_security_events_dropped_total{reason="sink_error"}, it never
// fails the RPC. The events a sandbox reports are limited per sandbox
// (a token bucket, Options.SandboxRate): the excess is counted with
// reason "rate_limited" and summarised by one Detection Finding per
// interval; the gateway's own events are never limited.
package securityevent
