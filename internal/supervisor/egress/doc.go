// Package egress is the sandbox's egress proxy: the only way out of a
// sandbox whose network namespace has nothing but loopback.
//
// Agent processes reach it through HTTP_PROXY/HTTPS_PROXY/ALL_PROXY on a
// loopback address inside the sandbox's network namespace. For each HTTP
// CONNECT and each absolute-form http:// request (connections are kept
// alive; every request is decided on its own) the proxy
//
//  1. identifies the processes holding the client socket (identify_linux.go:
//     the TCP tuple to the socket inode through the kernel's sock_diag
//     netlink lookup, the inode to every holder by scanning /proc/*/fd,
//     then each holder's executable and its parents' through the
//     /proc/<pid> directory opened during the scan, so a reused pid is
//     never confused with the holder; a binary's content is hashed on
//     first use, cached by file identity, and a later different content
//     at the same path is denied);
//  2. decides against one immutable Snapshot of network_policies (host
//     exact or wildcard, port, binaries; the first matching rule by name)
//     with the Rego policy policy.rego, evaluated by the Open Policy Agent
//     library (engine.go): prepared once per Snapshot with the rules as
//     its base document, evaluated with a small AST input once per
//     distinct request of the Snapshot (the verdicts are kept by request,
//     bounded: the evaluation depends on nothing else); an evaluation
//     error or a missing decision denies (and is not kept);
//  3. resolves the host once, refuses loopback, link-local, private and
//     reserved addresses, cloud metadata names and the gateway's own
//     addresses unless the matching endpoint's allowed_ips names them, and
//     dials only the checked addresses (no DNS rebinding between check and
//     dial);
//  4. for endpoints with protocol rest, inspects each plain HTTP request's
//     method, canonical path and query against the endpoints' allow and
//     deny rules (l7.go; deny wins, enforce answers 403, audit forwards);
//     inside a CONNECT tunnel to such an endpoint (unless tls skip, whose
//     tunnels are relayed uninspected) TLS is detected from the first
//     byte, as in OpenShell (tls: terminate and passthrough change
//     nothing), and terminated (tls.go: a leaf of the sandbox CA, HTTP/1.1
//     only; upstream TLS verified against Config.UpstreamRoots), and each
//     inner request is inspected as above;
//  5. resolves provider credential placeholders in each admitted HTTP
//     request through Config.Credentials (package egress/placeholder;
//     credentials.go);
//  6. reports the decision as an Event, counts it in Config.Metrics and
//     counts denials in Denials.
//
// Two hosts are answered in the sandbox instead, without a policy
// decision: inference.local (Config.Inference, inference.go) and
// policy.local, the policy advisor's agent API (Config.PolicyLocal,
// policylocal.go: plain http:// on port 80 only; another port or a
// CONNECT is 400 invalid_policy_local_scheme).
//
// Only the connection decision (2) is Rego. Identification (1) needs /proc
// and the file, the address check (3) needs the resolution that follows
// the decision, and the REST rules (4) run once per HTTP request, where a
// Rego evaluation (tens of microseconds) would cost far more than the Go
// matcher (under one): those stay Go.
//
// Dialing happens outside the sandbox's network namespace through the
// Config.Dial function; the supervisor uses package hostdial for it.
// Upstream connections of plain HTTP requests and of terminated tunnels
// that end cleanly are pooled by host and port (pool.go) and taken again
// only when the current policy admits the address they reach.
package egress
