package egress

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// Snapshot is one immutable, compiled generation of a sandbox's
// network_policies. Every connection is decided against exactly one
// Snapshot; a new policy generation is a new Snapshot.
type Snapshot struct {
	rules  []rule   // sorted by name, so the first match is the smallest name
	notes  []string // what applies differently from what a reader may expect
	module string   // the Rego decision's module (policyRego outside tests)

	once   sync.Once // prepares engine, by Prepare or the first Decide
	engine *engine   // the Rego decision prepared for rules; nil when it failed
	failed error     // why engine is nil: every connection is denied
}

// Prepare prepares the generation's Rego decision (compiles the module
// with the generation's rules stored as its data) unless that is done:
// the first Decide does it otherwise, and waits for a Prepare under way.
// It returns why it failed, the reason every decision of the generation
// then denies. The module is the supervisor's own (nothing of the
// user's policy is compiled: the rules are data), so Compile, which
// checks everything of the policy, leaves this step for after the
// sandbox is READY. Safe for concurrent use.
func (s *Snapshot) Prepare() error {
	s.once.Do(func() { s.engine, s.failed = newEngine(s.module, s.rules) })
	return s.failed
}

// Notes lists what the snapshot enforces as written but less than a
// reader may expect: REST endpoints with tls skip, whose rules do not
// apply inside CONNECT tunnels. The supervisor logs them; they are not
// load errors (OpenShell's semantics).
func (s *Snapshot) Notes() []string { return s.notes }

type rule struct {
	name      string
	endpoints []endpoint
	binaries  []string
}

type endpoint struct {
	host       string // selector as written ("" = hostless, allowed_ips only)
	ports      []uint32
	allowedIPs []netip.Prefix
	l7         *l7Endpoint // protocol rest: requests are inspected
}

// Request is what one connection asks for.
type Request struct {
	Host string // as the client named it (CONNECT authority or URL host)
	Port uint32
	// Exe is the kernel-resolved executable of the process owning the
	// client socket; Ancestors are its parents' executables, nearest
	// first. Argv is never part of a request.
	Exe       string
	Ancestors []string
}

// Decision is the outcome for one Request.
type Decision struct {
	Allow  bool
	Policy string // the matching rule's name ("" when denied)
	Reason string // why it was denied ("" when allowed)
	// AllowedIPs is the union of allowed_ips of the matching endpoints of
	// the matching rule: addresses the SSRF guard lets through.
	AllowedIPs []netip.Prefix
	// Hostless: the match came from an endpoint without a host, which
	// only allows destinations inside AllowedIPs.
	Hostless bool
	// l7 are the REST endpoints (protocol rest) matching host and port in
	// every rule that allows the caller: when any, each HTTP request is
	// inspected against them, inside a CONNECT tunnel too (TLS detected and
	// terminated) unless every one of them says tls skip.
	l7 []*l7Endpoint
}

// Compile builds a Snapshot from network_policies. It also returns an
// error naming every endpoint asking for what this proxy does not enforce
// (L7 protocols other than REST, credential handling, ...): such a policy
// is not enforced as written and must not be reported LOADED. The Snapshot
// is usable either way: it leaves those endpoints out, so connections they
// would have allowed are denied (fail closed) while the rest of the policy
// applies. The generation's Rego decision is prepared once, by Prepare or
// the first Decide (each Decide then only evaluates it); when that fails
// the Snapshot denies every connection, naming the cause.
func Compile(rules map[string]*sandboxv1.NetworkPolicyRule) (*Snapshot, error) {
	return compileRules(policyRego, rules)
}

// compile is Compile with the Rego module given (tests give broken ones)
// and the decision prepared: its error is Prepare's when that fails.
func compile(module string, rules map[string]*sandboxv1.NetworkPolicyRule) (*Snapshot, error) {
	s, err := compileRules(module, rules)
	if perr := s.Prepare(); perr != nil {
		return s, perr
	}
	return s, err
}

// compileRules is Compile with the Rego module given, not prepared.
func compileRules(module string, rules map[string]*sandboxv1.NetworkPolicyRule) (*Snapshot, error) {
	s := &Snapshot{module: module}
	var problems []string
	for _, key := range slices.Sorted(maps.Keys(rules)) {
		r := rules[key]
		name := r.GetName()
		if name == "" {
			name = key
		}
		cr := rule{name: name}
		for _, b := range r.GetBinaries() {
			cr.binaries = append(cr.binaries, b.GetPath())
		}
		for _, ep := range r.GetEndpoints() {
			if ps := unsupported(ep); len(ps) > 0 {
				problems = append(problems, fmt.Sprintf("rule %q endpoint %q asks for %s", name, ep.GetHost(), strings.Join(ps, ", ")))
				continue
			}
			ce := endpoint{host: ep.GetHost(), ports: ep.GetPorts()}
			if strings.EqualFold(ep.GetProtocol(), "rest") {
				l, ps := compileL7(ep)
				if len(ps) > 0 {
					problems = append(problems, fmt.Sprintf("rule %q endpoint %q: %s", name, ep.GetHost(), strings.Join(ps, ", ")))
					continue
				}
				if l.tlsSkip = ep.GetTls() == "skip"; l.tlsSkip {
					s.notes = append(s.notes, fmt.Sprintf("rule %q endpoint %q: tls skip: its REST rules apply to plain http:// requests only, CONNECT tunnels to it (HTTPS) are relayed uninspected", name, ep.GetHost()))
				}
				ce.l7 = l
			}
			if len(ce.ports) == 0 && ep.GetPort() != 0 {
				ce.ports = []uint32{ep.GetPort()}
			}
			for _, a := range ep.GetAllowedIps() {
				pfx, err := parsePrefix(a)
				if err != nil {
					problems = append(problems, fmt.Sprintf("rule %q endpoint %q: allowed_ips %q: %v", name, ep.GetHost(), a, err))
					ce.ports = nil // left out, fail closed
					break
				}
				ce.allowedIPs = append(ce.allowedIPs, pfx)
			}
			if ce.ports != nil {
				cr.endpoints = append(cr.endpoints, ce)
			}
		}
		s.rules = append(s.rules, cr)
	}
	// The first matching rule is the one with the smallest name (the map
	// key breaks ties), as in OpenShell.
	slices.SortStableFunc(s.rules, func(a, b rule) int { return strings.Compare(a.name, b.name) })
	if len(problems) > 0 {
		return s, fmt.Errorf("%s: not implemented by the egress proxy, those endpoints are denied", strings.Join(problems, "; "))
	}
	return s, nil
}

// unsupported lists what an endpoint asks for beyond host, port(s),
// allowed_ips, the rule's binaries and REST inspection (protocol rest,
// of plain HTTP and of CONNECT tunnels, TLS terminated): other L7
// protocols, TLS termination without REST, credential handling.
func unsupported(ep *sandboxv1.NetworkEndpoint) []string {
	var out []string
	rest := strings.EqualFold(ep.GetProtocol(), "rest")
	if p := ep.GetProtocol(); p != "" && !strings.EqualFold(p, "tcp") && !rest {
		out = append(out, fmt.Sprintf("protocol %q", p))
	}
	switch t := ep.GetTls(); {
	case t == "" || t == "passthrough" || t == "skip":
	case t == "terminate" && !rest:
		out = append(out, `tls "terminate" without protocol rest (only REST requests are inspected)`)
	case t != "terminate":
		out = append(out, fmt.Sprintf("tls %q (want skip, terminate or passthrough)", t))
	}
	for _, f := range []struct {
		set  bool
		name string
	}{
		{!rest && ep.GetEnforcement() != "", "enforcement without protocol rest"},
		{!rest && ep.GetAccess() != "", "access without protocol rest"},
		{!rest && len(ep.GetRules()) > 0, "rules without protocol rest"},
		{!rest && len(ep.GetDenyRules()) > 0, "deny_rules without protocol rest"},
		{!rest && ep.GetAllowEncodedSlash(), "allow_encoded_slash without protocol rest"},
		{ep.GetPath() != "", "path"},
		{ep.GetCredentialSigning() != "" || ep.GetCredentialBinding() != nil || ep.GetWebsocketCredentialRewrite() ||
			ep.GetProviderCredentialed() || ep.GetAllowUninspectedCredentials(), "credential handling"},
		{!rest && ep.GetRequestBodyCredentialRewrite(), "request_body_credential_rewrite without protocol rest"},
		{ep.GetPersistedQueries() != "" || len(ep.GetGraphqlPersistedQueries()) > 0 || ep.GetGraphqlMaxBodyBytes() != 0 ||
			ep.GetJsonRpcMaxBodyBytes() != 0 || ep.GetMcp() != nil, "GraphQL, JSON-RPC or MCP options"},
	} {
		if f.set {
			out = append(out, f.name)
		}
	}
	return out
}

// parsePrefix accepts an address or a CIDR prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Decide evaluates r with the generation's Rego decision (policy.rego):
// a rule matches when one of its endpoints matches host and port and one
// of its binaries matches the executable or an ancestor's; the first
// matching rule by name wins (its name and allowed_ips are the
// decision's), and the REST endpoints of every matching rule apply. An
// evaluation error or a missing decision denies (fail closed). Safe for
// concurrent use.
func (s *Snapshot) Decide(r Request) Decision { return s.decision(r, true) }

// decision is Decide, through the generation's memo of verdicts or not
// (memo false: the evaluation's own cost, for BenchmarkDecide).
func (s *Snapshot) decision(r Request, memo bool) Decision {
	if err := s.Prepare(); err != nil {
		return Decision{Reason: fmt.Sprintf("no policy decision: %v", err)}
	}
	eval := s.engine.eval
	if memo {
		eval = s.engine.decide
	}
	v, err := eval(r)
	if err != nil {
		return Decision{Reason: fmt.Sprintf("no policy decision: %v", err)}
	}
	if !v.allow {
		return Decision{Reason: v.reason}
	}
	return s.allowed(v)
}

// allowed turns the engine's allow into a Decision: the first rule's name,
// the allowed_ips of its matching endpoints (Hostless when all of them
// are), and the REST endpoints of every match. An index out of range is
// a denial, as any malformed result.
func (s *Snapshot) allowed(v verdict) Decision {
	if v.rule < 0 || v.rule >= len(s.rules) {
		return Decision{Reason: "no policy decision: rule index out of range"}
	}
	d := Decision{Allow: true, Policy: s.rules[v.rule].name, Hostless: true}
	for _, m := range v.matches {
		if m[0] < 0 || m[0] >= len(s.rules) || m[1] < 0 || m[1] >= len(s.rules[m[0]].endpoints) {
			return Decision{Reason: "no policy decision: endpoint index out of range"}
		}
		ep := &s.rules[m[0]].endpoints[m[1]]
		if m[0] == v.rule {
			d.AllowedIPs = append(d.AllowedIPs, ep.allowedIPs...)
			d.Hostless = d.Hostless && ep.host == ""
		}
		if ep.l7 != nil {
			d.l7 = append(d.l7, ep.l7)
		}
	}
	return d
}
