package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// TestRegoDecisionAttacks runs host and binary tricks through the Rego
// decision: each must be decided exactly as listed, with the reason.
func TestRegoDecisionAttacks(t *testing.T) {
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"one":   {Name: "one", Endpoints: []*sandboxv1.NetworkEndpoint{ep("*.example.com", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/*"}}},
		"exact": {Name: "exact", Endpoints: []*sandboxv1.NetworkEndpoint{ep("API.Exact.ORG", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/opt/*/tool"}}},
		"empty": {Name: "empty", Endpoints: []*sandboxv1.NetworkEndpoint{ep("empty.test", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: ""}}},
		"metas": {Name: "metas", Endpoints: []*sandboxv1.NetworkEndpoint{ep("*.ex[a]mple.{net,org}", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/lib/py?*"}, {Path: "/srv/[ab]*"}}},
	})
	deniedHost := func(h string) string { return "endpoint " + h + ":443 is not allowed by any policy" }
	runDecideCases(t, s, []decideCase{
		{"one label", Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/curl"}, "one", ""},
		{"suffix smuggled as labels", Request{Host: "evil.com.example.com", Port: 443, Exe: "/usr/bin/curl"}, "", deniedHost("evil.com.example.com")},
		{"wildcard host as prefix of another domain", Request{Host: "api.example.com.evil.net", Port: 443, Exe: "/usr/bin/curl"}, "", deniedHost("api.example.com.evil.net")},
		{"no label before the suffix", Request{Host: "example.com", Port: 443, Exe: "/usr/bin/curl"}, "", deniedHost("example.com")},
		{"lookalike without dot", Request{Host: "evilexample.com", Port: 443, Exe: "/usr/bin/curl"}, "", deniedHost("evilexample.com")},
		{"upper case and trailing dot", Request{Host: "API.EXAMPLE.COM.", Port: 443, Exe: "/usr/bin/curl"}, "one", ""},
		{"two trailing dots", Request{Host: "api.example.com..", Port: 443, Exe: "/usr/bin/curl"}, "", deniedHost("api.example.com..")},
		{"exact selector written upper case", Request{Host: "api.exact.org", Port: 443, Exe: "/opt/x/tool"}, "exact", ""},
		{"binary glob across slash", Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/../../tmp/evil"}, "", "binary '/usr/bin/../../tmp/evil' not allowed in policy 'one'"},
		{"binary glob one level deeper", Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/sub/curl"}, "", "binary '/usr/bin/sub/curl' not allowed in policy 'one'"},
		{"middle binary glob across slash", Request{Host: "api.exact.org", Port: 443, Exe: "/opt/a/b/tool"}, "", "binary '/opt/a/b/tool' not allowed in policy 'exact'"},
		{"host brackets are literal", Request{Host: "x.example.net", Port: 443, Exe: "/usr/lib/py?3"}, "", deniedHost("x.example.net")},
		{"host braces are literal", Request{Host: "x.ex[a]mple.{net,org}", Port: 443, Exe: "/usr/lib/py?3"}, "metas", ""},
		{"binary ? is literal", Request{Host: "x.ex[a]mple.{net,org}", Port: 443, Exe: "/usr/lib/pyx3"}, "", "binary '/usr/lib/pyx3' not allowed in policy 'metas'"},
		{"binary class is literal", Request{Host: "x.ex[a]mple.{net,org}", Port: 443, Exe: "/srv/a1"}, "", "binary '/srv/a1' not allowed in policy 'metas'"},
		{"binary class written literally", Request{Host: "x.ex[a]mple.{net,org}", Port: 443, Exe: "/srv/[ab]1"}, "metas", ""},
		{"unidentified caller never matches an empty entry", Request{Host: "empty.test", Port: 443, Exe: "", Ancestors: []string{""}}, "", "binary '' not allowed in policy 'empty'"},
	})
}

// TestRegoFailsClosed: a module that does not compile makes Compile fail
// and the snapshot deny everything; an evaluation error, an undefined
// decision or a malformed one is a denial naming the cause.
func TestRegoFailsClosed(t *testing.T) {
	rules := map[string]*sandboxv1.NetworkPolicyRule{"r": {Name: "r", Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.example.com", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/**"}}}}
	req := Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/curl"}
	tests := []struct {
		name, module string
		compileErr   bool
		reason       string // substring of the denial
	}{
		{"does not compile", "package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": undefined_var}\n", true, "no policy decision: policy engine: "},
		{"evaluation error", "package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": to_number(\"x\"), \"matches\": {[0, 0]}}\n", false, "eval_builtin_error: to_number"},
		{"undefined", "package openshell.egress\n\ndecision := 1 if false\n", false, "no policy decision: the policy engine returned no decision"},
		{"not an object", "package openshell.egress\n\ndecision := true\n", false, "no policy decision: policy engine: decision is boolean, want an object"},
		{"allow without matches", "package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": 0}\n", false, "no policy decision: policy engine: allow without its rule and matches"},
		{"denial without reason", "package openshell.egress\n\ndecision := {\"allow\": false}\n", false, "no policy decision: policy engine: denial without a reason"},
		{"rule out of range", "package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": 7, \"matches\": {[7, 0]}}\n", false, "no policy decision: rule index out of range"},
		{"endpoint out of range", "package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": 0, \"matches\": {[0, 3]}}\n", false, "no policy decision: endpoint index out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := compile(tt.module, rules)
			if (err != nil) != tt.compileErr {
				t.Fatalf("compile error = %v, want error %v", err, tt.compileErr)
			}
			d := s.Decide(req)
			if d.Allow || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("Decide = %+v, want a denial containing %q", d, tt.reason)
			}
		})
	}
	// The real module compiles and allows the same request.
	if s, err := compile(policyRego, rules); err != nil || !s.Decide(req).Allow {
		t.Fatalf("compile(policy.rego) = %v; want the request allowed", err)
	}
}

// TestDecideConcurrent: one prepared generation decides from many
// goroutines at once (the proxy's connections), each getting its own
// answer (run with -race).
func TestDecideConcurrent(t *testing.T) {
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"a": {Name: "a", Endpoints: []*sandboxv1.NetworkEndpoint{ep("*.a.test", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/a"}}},
		"b": {Name: "b", Endpoints: []*sandboxv1.NetworkEndpoint{ep("**.b.test", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/opt/b/**"}}},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				var req Request
				var want string
				switch (g + i) % 3 {
				case 0:
					req, want = Request{Host: "x.a.test", Port: 443, Exe: "/usr/bin/a"}, "a"
				case 1:
					req, want = Request{Host: "x.y.b.test", Port: 443, Exe: "/opt/b/bin/tool"}, "b"
				default:
					req = Request{Host: "x.y.b.test", Port: 443, Exe: "/usr/bin/a"}
				}
				if d := s.Decide(req); d.Policy != want || d.Allow != (want != "") {
					t.Errorf("Decide(%+v) = %+v, want policy %q", req, d, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestDecideAcrossRules: when several rules match, the one with the
// smallest name (not map key) names the decision and alone gives its
// allowed_ips; the REST endpoints of every rule allowing the caller
// apply, and none of a rule whose binaries deny it. A denial for the
// binary names the smallest rule whose endpoint matched.
func TestDecideAcrossRules(t *testing.T) {
	rest := func(allowIPs ...string) *sandboxv1.NetworkEndpoint {
		return restEP(func(e *sandboxv1.NetworkEndpoint) {
			e.AllowedIps = allowIPs
			e.Rules = []*sandboxv1.L7Rule{allow("GET", "/**", nil)}
		})
	}
	curl := []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"k1": {Name: "b-rest", Endpoints: []*sandboxv1.NetworkEndpoint{rest("10.0.0.0/8")}, Binaries: curl},
		"k2": {Name: "a-first", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.example.com", Port: 80, AllowedIps: []string{"192.168.1.0/24"}}, ep("other.example.com", 80)},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/*"}}},
		"k0": {Name: "c-wget", Endpoints: []*sandboxv1.NetworkEndpoint{rest()}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/wget"}}},
	})
	d := s.Decide(Request{Host: "api.example.com", Port: 80, Exe: "/usr/bin/curl"})
	if !d.Allow || d.Policy != "a-first" || d.Hostless {
		t.Fatalf("Decide(curl) = %+v, want allowed by a-first", d)
	}
	if len(d.AllowedIPs) != 1 || d.AllowedIPs[0] != netip.MustParsePrefix("192.168.1.0/24") {
		t.Errorf("AllowedIPs = %v, want a-first's only", d.AllowedIPs)
	}
	if len(d.l7) != 1 || d.l7 != nil && d.l7[0] != s.rules[1].endpoints[0].l7 {
		t.Errorf("l7 = %v, want b-rest's REST endpoint only (not c-wget's)", d.l7)
	}
	runDecideCases(t, s, []decideCase{
		{"binary denied everywhere", Request{Host: "api.example.com", Port: 80, Exe: "/bin/ls"}, "", "binary '/bin/ls' not allowed in policy 'a-first'"},
		{"wget, allowed by two rules", Request{Host: "api.example.com", Port: 80, Exe: "/usr/bin/wget"}, "a-first", ""},
	})
}

// TestDecideLargePolicy: a generation with more glob patterns than OPA's
// shared cache holds (its own cache of compiled patterns) decides like a
// small one, for the last rule's patterns as for the first's.
func TestDecideLargePolicy(t *testing.T) {
	rules := map[string]*sandboxv1.NetworkPolicyRule{}
	for i := range 60 {
		r := fmt.Sprintf("r%02d", i)
		rules[r] = &sandboxv1.NetworkPolicyRule{Name: r,
			Endpoints: []*sandboxv1.NetworkEndpoint{ep("*."+r+".example.net", 443), ep("**."+r+".example.org", 443)},
			Binaries:  []*sandboxv1.NetworkBinary{{Path: "/opt/" + r + "/**"}}}
	}
	s := mustCompile(t, rules)
	if s.engine.globs == nil {
		t.Fatal("180 patterns use the shared glob cache")
	}
	for range 2 { // compiled patterns, then cached ones
		runDecideCases(t, s, []decideCase{
			{"first rule", Request{Host: "a.r00.example.net", Port: 443, Exe: "/opt/r00/bin/x"}, "r00", ""},
			{"last rule", Request{Host: "a.b.r59.example.org", Port: 443, Exe: "/opt/r59/x"}, "r59", ""},
			{"one label only", Request{Host: "a.b.r59.example.net", Port: 443, Exe: "/opt/r59/x"}, "", "endpoint a.b.r59.example.net:443 is not allowed by any policy"},
			{"other rule's binary", Request{Host: "a.r30.example.net", Port: 443, Exe: "/opt/r31/x"}, "", "binary '/opt/r31/x' not allowed in policy 'r30'"},
		})
	}
}

// TestDecisionMemo: a generation evaluates a request once; the memo keeps
// requests apart field by field, keeps no evaluation error and stays
// bounded.
func TestDecisionMemo(t *testing.T) {
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"up": {Name: "up", Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.example.com", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
	})
	allowed := Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/curl", Ancestors: []string{"/bin/sh"}}
	for range 3 {
		if d := s.Decide(allowed); !d.Allow || d.Policy != "up" {
			t.Fatalf("Decide(%+v) = %+v", allowed, d)
		}
	}
	if n := s.engine.evals.Load(); n != 1 {
		t.Errorf("three identical requests evaluated %d times, want 1", n)
	}
	// Each differs from allowed in one field (or in how its fields split):
	// each is evaluated and denied.
	for _, r := range []Request{
		{Host: "api.example.com.", Port: 443, Exe: "/usr/bin/curlx", Ancestors: []string{"/bin/sh"}},
		{Host: "api.example.com", Port: 4430, Exe: "/usr/bin/curl", Ancestors: []string{"/bin/sh"}},
		{Host: "api.example.com", Port: 443, Exe: "/usr/bin/wget", Ancestors: []string{"/bin/sh"}},
		{Host: "api.example.com", Port: 443, Exe: "/bin/sh", Ancestors: []string{"/usr/bin/wget"}},
		{Host: "api.example.com443", Port: 0, Exe: "/usr/bin/curl", Ancestors: []string{"/bin/sh"}},
		{Host: "api.example.com", Port: 443, Exe: "/usr/bin/wget", Ancestors: []string{"/bin/sh", "/usr/bin/curl0"}},
	} {
		if memoKey(r) == memoKey(allowed) {
			t.Errorf("%+v and %+v share a memo key", r, allowed)
		}
		if d := s.Decide(r); d.Allow {
			t.Errorf("Decide(%+v) = %+v, want a denial", r, d)
		}
	}
	if n := s.engine.evals.Load(); n != 7 {
		t.Errorf("evaluations = %d, want 7 (one per distinct request)", n)
	}

	// An evaluation error denies and is evaluated again next time.
	bad, err := compile("package openshell.egress\n\ndecision := {\"allow\": false, \"reason\": sprintf(\"%d\", [to_number(input.host)])}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if d := bad.Decide(Request{Host: "x", Port: 1}); d.Allow || !strings.Contains(d.Reason, "no policy decision") {
			t.Fatalf("Decide with an evaluation error = %+v", d)
		}
	}
	if n := bad.engine.evals.Load(); n != 2 {
		t.Errorf("a failing request evaluated %d times in 2 decisions, want 2", n)
	}

	// Bounded: distinct hosts past the bound start the memo again; a key
	// past maxMemoKey is never kept.
	for i := range maxMemoEntries + 10 {
		s.Decide(Request{Host: fmt.Sprintf("h%d.example.com", i), Port: 443, Exe: "/usr/bin/curl"})
	}
	s.engine.mu.Lock()
	n := len(s.engine.memo)
	s.engine.mu.Unlock()
	if n > maxMemoEntries || n == 0 {
		t.Errorf("memo holds %d entries, want 1..%d", n, maxMemoEntries)
	}
	long := Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/curl", Ancestors: []string{strings.Repeat("/x", maxMemoKey)}}
	before := s.engine.evals.Load()
	s.Decide(long)
	s.Decide(long)
	if n := s.engine.evals.Load() - before; n != 2 {
		t.Errorf("a request past maxMemoKey evaluated %d times in 2 decisions, want 2", n)
	}
}

// TestCompileLeavesPrepare: Compile prepares no Rego decision; the first
// Decide prepares it, once, for every concurrent caller, and decides as a
// prepared snapshot; a decision that cannot be prepared denies every
// connection, naming the cause, and Prepare returns it.
func TestCompileLeavesPrepare(t *testing.T) {
	rules := map[string]*sandboxv1.NetworkPolicyRule{"r": {Name: "r", Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.example.com", 443)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
	s, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	if s.engine != nil {
		t.Fatal("Compile prepared the Rego decision")
	}
	req := Request{Host: "api.example.com", Port: 443, Exe: "/usr/bin/curl"}
	var wg sync.WaitGroup
	engines := make([]*engine, 4)
	for i := range engines {
		wg.Go(func() {
			if d := s.Decide(req); !d.Allow || d.Policy != "r" {
				t.Errorf("Decide = %+v, want allowed by r", d)
			}
			engines[i] = s.engine
		})
	}
	wg.Wait()
	for _, e := range engines {
		if e == nil || e != engines[0] {
			t.Fatalf("engines %p, want one prepared engine", engines)
		}
	}
	if err := s.Prepare(); err != nil || s.engine != engines[0] {
		t.Fatalf("Prepare after Decide = %v, engine %p; want nil, the same engine", err, s.engine)
	}

	bad, err := compileRules("package openshell.egress\n\ndecision := {\"allow\": true, \"rule\": undefined_var}\n", rules)
	if err != nil {
		t.Fatalf("compileRules = %v; the module is not compiled yet", err)
	}
	if d := bad.Decide(req); d.Allow || !strings.Contains(d.Reason, "no policy decision: policy engine: ") {
		t.Fatalf("Decide with a module that does not compile = %+v, want a denial naming the engine", d)
	}
	if err := bad.Prepare(); err == nil || !strings.Contains(err.Error(), "policy engine: ") {
		t.Fatalf("Prepare = %v, want the compile error", err)
	}
}
