package egress

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

func TestHostMatches(t *testing.T) {
	tests := []struct {
		selector, host string
		want           bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.Example.COM", true},
		{"api.example.com", "api.example.com.", true},
		{"api.example.com", "x.api.example.com", false},
		{"api.example.com", "example.com", false},
		{"*.example.com", "api.example.com", true},
		{"*.example.com", "a.b.example.com", false},
		{"*.example.com", "example.com", false},
		{"*.example.com", "api.example.org", false},
		{"*.example.com", "evilexample.com", false},
		{"**.example.com", "api.example.com", true},
		{"**.example.com", "a.b.c.example.com", true},
		{"**.example.com", "example.com", false},
		{"**.example.com", "example.com.evil.net", false},
		{"*-aiplatform.googleapis.com", "us-central1-aiplatform.googleapis.com", true},
		{"*-aiplatform.googleapis.com", "aiplatform.googleapis.com", false},
		{"*-aiplatform.googleapis.com", "a.us-aiplatform.googleapis.com", false},
		{"*.s3.*.amazonaws.com", "bucket.s3.us-east-1.amazonaws.com", true},
		{"*.s3.*.amazonaws.com", "bucket.s3.amazonaws.com", false},
		{"*.s3.*.amazonaws.com", "a.bucket.s3.us-east-1.amazonaws.com", false},
		{"*.s3.*.amazonaws.com", "bucket.s3.a.b.amazonaws.com", false},
		{"api.*", "api.example", true},
		{"api.*", "api.a.example", false},
		{"api.**", "api.a.example", true},
		{"api.**.com", "api.a.b.com", true},
		{"api.**.com", "api.com", false},
		{"**example.com", "example.com", true},
		{"**example.com", "a.notexample.com", true},
		{"**example.com", "example.com.evil", false},
		{"*.*.example.com", "a.b.example.com", true},
		{"*.*.example.com", "b.example.com", false},
		{"*.example.com", "a..example.com", false},
		{"**.example.com", "a..example.com", true},
		{"*.example.com", "API.Example.COM.", true},
		{"**example.com", "EXAMPLE.COM.", true},
		{"api.*", "API.Example.", true},
		{"*", "anything.at.all", true},
		{"**", "anything.at.all", true},
	}
	for _, tt := range tests {
		s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{"r": {Name: "r",
			Endpoints: []*sandboxv1.NetworkEndpoint{ep(tt.selector, 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/**"}}}})
		if got := s.Decide(Request{Host: tt.host, Port: 443, Exe: "/usr/bin/curl"}); got.Allow != tt.want {
			t.Errorf("host %q under selector %q: Decide = %+v, want allow %v", tt.host, tt.selector, got, tt.want)
		}
	}
}

func TestBinaryMatches(t *testing.T) {
	tests := []struct {
		entry, path string
		want        bool
	}{
		{"/usr/bin/curl", "/usr/bin/curl", true},
		{"/usr/bin/curl", "/usr/local/bin/curl", false},
		{"/usr/bin/curl", "/usr/bin/curl2", false},
		{"/usr/bin/*", "/usr/bin/curl", true},
		{"/usr/bin/*", "/usr/bin/sub/curl", false},
		{"/usr/**", "/usr/bin/sub/curl", true},
		{"/**", "/sandbox/tool", true},
		{"/usr/bin/python3*", "/usr/bin/python3.11", true},
		{"/usr/bin/python3*", "/usr/bin/python2", false},
	}
	for _, tt := range tests {
		s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{"r": {Name: "r",
			Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.example.com", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: tt.entry}}}})
		for _, req := range []Request{
			{Host: "api.example.com", Port: 443, Exe: tt.path},
			{Host: "api.example.com", Port: 443, Exe: "/bin/sh", Ancestors: []string{"/sbin/init", tt.path}},
		} {
			if got := s.Decide(req); got.Allow != tt.want {
				t.Errorf("binary entry %q, caller %+v: Decide = %+v, want allow %v", tt.entry, req, got, tt.want)
			}
		}
	}
}

func ep(host string, ports ...uint32) *sandboxv1.NetworkEndpoint {
	return &sandboxv1.NetworkEndpoint{Host: host, Ports: ports}
}

func mustCompile(t testing.TB, rules map[string]*sandboxv1.NetworkPolicyRule) *Snapshot {
	t.Helper()
	s, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}

// decideCase is one request and its exact decision: the allowing rule, or
// the denial reason.
type decideCase struct {
	name   string
	req    Request
	policy string // "" = denied
	reason string
}

func runDecideCases(t *testing.T, s *Snapshot, cases []decideCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			d := s.Decide(tt.req)
			if d.Policy != tt.policy || d.Allow != (tt.policy != "") || d.Reason != tt.reason {
				t.Errorf("Decide(%+v) = %+v, want policy %q reason %q", tt.req, d, tt.policy, tt.reason)
			}
			// The generation's memo (filled by the cases before) answers
			// as the evaluation does.
			if again, eval := s.Decide(tt.req), s.decision(tt.req, false); !reflect.DeepEqual(again, d) || !reflect.DeepEqual(eval, d) {
				t.Errorf("Decide(%+v) again = %+v, evaluated = %+v, want %+v", tt.req, again, eval, d)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"github": {Name: "github", Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.github.com", 443), ep("*.githubusercontent.com", 443)},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
		"pypi": {Name: "pypi", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/python3*"}}},
		"anyone": {Name: "anyone", Endpoints: []*sandboxv1.NetworkEndpoint{ep("**.example.com", 80, 8080)},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/**"}}},
		"internal": {Name: "internal", Endpoints: []*sandboxv1.NetworkEndpoint{{Ports: []uint32{5432}, AllowedIps: []string{"10.1.0.0/16"}}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/psql"}}},
		"nobinaries": {Name: "nobinaries", Endpoints: []*sandboxv1.NetworkEndpoint{ep("open.example.org", 443)}},
	})
	runDecideCases(t, s, []decideCase{
		{"exact host, binary", Request{Host: "api.github.com", Port: 443, Exe: "/usr/bin/curl"}, "github", ""},
		{"wrong port", Request{Host: "api.github.com", Port: 80, Exe: "/usr/bin/curl"}, "", "endpoint api.github.com:80 is not allowed by any policy"},
		{"adjacent port", Request{Host: "api.github.com", Port: 444, Exe: "/usr/bin/curl"}, "", "endpoint api.github.com:444 is not allowed by any policy"},
		{"port below", Request{Host: "api.github.com", Port: 442, Exe: "/usr/bin/curl"}, "", "endpoint api.github.com:442 is not allowed by any policy"},
		{"wrong binary", Request{Host: "api.github.com", Port: 443, Exe: "/usr/bin/wget"}, "", "binary '/usr/bin/wget' not allowed in policy 'github'"},
		{"ancestor binary", Request{Host: "api.github.com", Port: 443, Exe: "/usr/bin/git-remote-https", Ancestors: []string{"/usr/bin/git", "/usr/bin/curl"}}, "github", ""},
		{"one-label wildcard", Request{Host: "raw.githubusercontent.com", Port: 443, Exe: "/usr/bin/curl"}, "github", ""},
		{"one-label wildcard, two labels", Request{Host: "a.raw.githubusercontent.com", Port: 443, Exe: "/usr/bin/curl"}, "", "endpoint a.raw.githubusercontent.com:443 is not allowed by any policy"},
		{"glob binary", Request{Host: "pypi.org", Port: 443, Exe: "/usr/bin/python3.12"}, "pypi", ""},
		{"ports list", Request{Host: "deep.a.example.com", Port: 8080, Exe: "/opt/x"}, "anyone", ""},
		{"hostless allowed_ips", Request{Host: "db.internal", Port: 5432, Exe: "/usr/bin/psql"}, "internal", ""},
		{"no binaries allow nothing", Request{Host: "open.example.org", Port: 443, Exe: "/usr/bin/curl"}, "", "binary '/usr/bin/curl' not allowed in policy 'nobinaries'"},
		{"unidentified caller", Request{Host: "api.github.com", Port: 443}, "", "binary '' not allowed in policy 'github'"},
	})
	if d := s.Decide(Request{Host: "db.internal", Port: 5432, Exe: "/usr/bin/psql"}); !d.Hostless || len(d.AllowedIPs) != 1 || d.AllowedIPs[0] != netip.MustParsePrefix("10.1.0.0/16") {
		t.Errorf("hostless decision = %+v, want Hostless with allowed_ips 10.1.0.0/16", d)
	}
	if d := mustCompile(t, nil).Decide(Request{Host: "a.b", Port: 1}); d.Allow || d.Reason != "network connections not allowed by policy" {
		t.Errorf("empty policy: %+v", d)
	}
}

func TestCompileRefusesWhatIsNotEnforced(t *testing.T) {
	s, err := Compile(map[string]*sandboxv1.NetworkPolicyRule{
		"l7": {Name: "l7", Binaries: []*sandboxv1.NetworkBinary{{Path: "/**"}}, Endpoints: []*sandboxv1.NetworkEndpoint{
			{Host: "api.example.com", Port: 443, Tls: "terminate"},
			{Host: "plain.example.com", Port: 443},
		}},
	})
	if err == nil {
		t.Fatal("Compile accepted tls terminate without protocol rest")
	}
	// The snapshot leaves the unenforced endpoint out and keeps the rest.
	if d := s.Decide(Request{Host: "api.example.com", Port: 443, Exe: "/bin/x"}); d.Allow {
		t.Errorf("an L7 endpoint was allowed at L4: %+v", d)
	}
	if d := s.Decide(Request{Host: "plain.example.com", Port: 443, Exe: "/bin/x"}); !d.Allow {
		t.Errorf("the plain endpoint next to an L7 one was denied: %+v", d)
	}
	if want := `rule "l7" endpoint "api.example.com" asks for tls "terminate" without protocol rest (only REST requests are inspected): not implemented by the egress proxy, those endpoints are denied`; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if _, err := Compile(map[string]*sandboxv1.NetworkPolicyRule{"t": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "a.example.com", Port: 443, Protocol: "tcp", Tls: "passthrough"}}}}); err != nil {
		t.Errorf("plain tcp endpoint refused: %v", err)
	}
}

// BenchmarkDecide is the "decision cost alone": one Rego
// evaluation of a prepared policy generation (8 rules, 24 endpoints, 16
// binary entries) for a caller matched through a "**" host, a ports list
// and a "/**" binary glob, and one denied for its binary (the reason is
// built); then the same two for a large generation (60 rules, 180
// endpoints, 120 host patterns, past OPA's shared glob cache). It reports
// p50 and p99 per decision, and the ratio of the p50 to the same-run
// "floor": the library's cost for a one-line Rego program on the same
// input (x-floor).
func BenchmarkDecide(b *testing.B) {
	policy := func(names []string) map[string]*sandboxv1.NetworkPolicyRule {
		rules := map[string]*sandboxv1.NetworkPolicyRule{}
		for _, n := range names {
			rules[n] = &sandboxv1.NetworkPolicyRule{Name: n,
				Endpoints: []*sandboxv1.NetworkEndpoint{ep(n+".example.com", 443), ep("*."+n+".example.net", 443), ep("**."+n+".example.org", 443, 8443)},
				Binaries:  []*sandboxv1.NetworkBinary{{Path: "/usr/bin/" + n}, {Path: "/opt/" + n + "/**"}}}
		}
		return rules
	}
	rules := policy([]string{"a", "b", "c", "d", "e", "f", "g", "h"})
	s := mustCompile(b, rules)
	var many []string
	for i := range 60 {
		many = append(many, fmt.Sprintf("r%02d", i))
	}
	large := mustCompile(b, policy(many))
	floor, err := compile("package openshell.egress\n\ndecision := {\"allow\": false, \"reason\": input.host}\n", rules)
	if err != nil {
		b.Fatal(err)
	}
	var floorP50 time.Duration
	for _, bc := range []struct {
		name  string
		snap  *Snapshot
		req   Request
		allow bool
		memo  bool // through the memo: every evaluation after the first is a lookup
	}{
		{"floor", floor, Request{Host: "x.y.h.example.org", Port: 8443, Exe: "/opt/h/bin/tool", Ancestors: []string{"/bin/bash", "/usr/bin/sshd"}}, false, false},
		{"allow", s, Request{Host: "x.y.h.example.org", Port: 8443, Exe: "/opt/h/bin/tool", Ancestors: []string{"/bin/bash", "/usr/bin/sshd"}}, true, false},
		{"deny", s, Request{Host: "api.c.example.net", Port: 443, Exe: "/usr/bin/wget", Ancestors: []string{"/bin/bash"}}, false, false},
		{"large-allow", large, Request{Host: "x.y.r59.example.org", Port: 8443, Exe: "/opt/r59/bin/tool", Ancestors: []string{"/bin/bash", "/usr/bin/sshd"}}, true, false},
		{"large-deny", large, Request{Host: "api.r30.example.net", Port: 443, Exe: "/usr/bin/wget", Ancestors: []string{"/bin/bash"}}, false, false},
		{"memo-allow", s, Request{Host: "x.y.h.example.org", Port: 8443, Exe: "/opt/h/bin/tool", Ancestors: []string{"/bin/bash", "/usr/bin/sshd"}}, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var times []time.Duration
			for b.Loop() {
				t0 := time.Now()
				d := bc.snap.decision(bc.req, bc.memo)
				times = append(times, time.Since(t0))
				if d.Allow != bc.allow {
					b.Fatalf("Decide(%+v) = %+v, want allow %v", bc.req, d, bc.allow)
				}
			}
			slices.Sort(times)
			p50 := times[len(times)/2]
			b.ReportMetric(float64(p50)/1e3, "p50-us")
			b.ReportMetric(float64(times[len(times)*99/100])/1e3, "p99-us")
			if bc.snap == floor {
				floorP50 = p50
			} else if floorP50 > 0 {
				b.ReportMetric(float64(p50)/float64(floorP50), "x-floor")
			}
		})
	}
}
