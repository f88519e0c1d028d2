package egress

import (
	"net/url"
	"strings"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

func restEP(mod func(*sandboxv1.NetworkEndpoint)) *sandboxv1.NetworkEndpoint {
	ep := &sandboxv1.NetworkEndpoint{Host: "api.example.com", Port: 80, Protocol: "rest", Enforcement: "enforce"}
	mod(ep)
	return ep
}

func allow(method, path string, q map[string]*sandboxv1.L7QueryMatcher) *sandboxv1.L7Rule {
	return &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: method, Path: path, Query: q}}
}

// decideREST compiles one rule with the given endpoints and decides
// "METHOD target" for /usr/bin/curl on api.example.com:80.
func decideREST(t *testing.T, eps []*sandboxv1.NetworkEndpoint, method, target string) l7Verdict {
	t.Helper()
	s, err := Compile(map[string]*sandboxv1.NetworkPolicyRule{"api": {Endpoints: eps, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	d := s.Decide(Request{Host: "api.example.com", Port: 80, Exe: "/usr/bin/curl"})
	if !d.Allow || len(d.l7) == 0 {
		t.Fatalf("Decide = %+v, want allowed with REST inspection", d)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p, err := canonicalPath(u.EscapedPath(), false)
	if err != nil {
		t.Fatalf("canonicalPath(%q): %v", target, err)
	}
	return decideL7(d.l7, &l7Request{method: method, path: p, query: u.Query()})
}

func TestL7Rules(t *testing.T) {
	q := func(kv ...string) map[string]*sandboxv1.L7QueryMatcher {
		m := map[string]*sandboxv1.L7QueryMatcher{}
		for i := 0; i < len(kv); i += 2 {
			if strings.Contains(kv[i+1], "|") {
				m[kv[i]] = &sandboxv1.L7QueryMatcher{Any: strings.Split(kv[i+1], "|")}
			} else {
				m[kv[i]] = &sandboxv1.L7QueryMatcher{Glob: kv[i+1]}
			}
		}
		return m
	}
	rules := func(r ...*sandboxv1.L7Rule) func(*sandboxv1.NetworkEndpoint) {
		return func(ep *sandboxv1.NetworkEndpoint) { ep.Rules = r }
	}
	access := func(a string, deny ...*sandboxv1.L7DenyRule) func(*sandboxv1.NetworkEndpoint) {
		return func(ep *sandboxv1.NetworkEndpoint) { ep.Access, ep.DenyRules = a, deny }
	}
	for _, tc := range []struct {
		name, method, target string
		ep                   func(*sandboxv1.NetworkEndpoint)
		allowed              bool
		reason               string
	}{
		{"method exact", "GET", "/x", rules(allow("GET", "/x", nil)), true, ""},
		{"method case-insensitive", "get", "/x", rules(allow("GET", "/x", nil)), true, ""},
		{"method other", "POST", "/x", rules(allow("GET", "/x", nil)), false, "POST /x not permitted by policy"},
		{"GET rule allows HEAD", "HEAD", "/x", rules(allow("GET", "/x", nil)), true, ""},
		{"HEAD rule does not allow GET", "GET", "/x", rules(allow("HEAD", "/x", nil)), false, "GET /x not permitted by policy"},
		{"method star", "DELETE", "/x", rules(allow("*", "/x", nil)), true, ""},
		{"path ** any", "GET", "/a/b/c", rules(allow("GET", "**", nil)), true, ""},
		{"path /repos/** deep", "GET", "/repos/o/r/issues", rules(allow("GET", "/repos/**", nil)), true, ""},
		{"path * one segment", "GET", "/repos/o/issues", rules(allow("GET", "/repos/*/issues", nil)), true, ""},
		{"path * not across /", "GET", "/repos/o/r/issues", rules(allow("GET", "/repos/*/issues", nil)), false, "GET /repos/o/r/issues not permitted by policy"},
		{"path ? one char", "GET", "/v1", rules(allow("GET", "/v?", nil)), true, ""},
		{"path class", "GET", "/v2", rules(allow("GET", "/v[0-9]", nil)), true, ""},
		{"path negated class", "GET", "/v0", rules(allow("GET", "/v[!0]", nil)), false, "GET /v0 not permitted by policy"},
		{"path canonicalized before matching", "GET", "/public/../admin", rules(allow("GET", "/public/**", nil)), false, "GET /admin not permitted by policy"},
		{"path percent-decoded", "GET", "/%61dmin", rules(allow("GET", "/admin", nil)), true, ""},
		{"query glob", "GET", "/dl?service=git-upload", rules(allow("GET", "/dl", q("service", "git-*"))), true, ""},
		{"query missing key", "GET", "/dl", rules(allow("GET", "/dl", q("service", "git-*"))), false, "GET /dl not permitted by policy"},
		{"query every value must match", "GET", "/dl?tag=foo-a&tag=evil", rules(allow("GET", "/dl", q("tag", "foo-*"))), false, "GET /dl not permitted by policy"},
		{"query any", "GET", "/dl?tag=v1.2&tag=v2.0", rules(allow("GET", "/dl", q("tag", "v1.*|v2.*"))), true, ""},
		{"query other keys ignored", "GET", "/dl?tag=foo-a&x=y", rules(allow("GET", "/dl", q("tag", "foo-*"))), true, ""},
		{"read-only GET", "GET", "/x", access("read-only"), true, ""},
		{"read-only OPTIONS", "OPTIONS", "/x", access("read-only"), true, ""},
		{"read-only POST", "POST", "/x", access("read-only"), false, "POST /x not permitted by policy"},
		{"read-write PATCH", "PATCH", "/x", access("read-write"), true, ""},
		{"read-write DELETE", "DELETE", "/x", access("read-write"), false, "DELETE /x not permitted by policy"},
		{"full DELETE", "DELETE", "/x", access("full"), true, ""},
		{"deny wins over full", "DELETE", "/repos/o/rulesets", access("full", &sandboxv1.L7DenyRule{Method: "*", Path: "/repos/*/rulesets"}), false, "DELETE /repos/o/rulesets blocked by deny rule"},
		{"deny other path", "DELETE", "/repos/o/x", access("full", &sandboxv1.L7DenyRule{Method: "*", Path: "/repos/*/rulesets"}), true, ""},
		{"deny query one value enough", "GET", "/s?f=ok&f=secret", access("full", &sandboxv1.L7DenyRule{Method: "GET", Path: "/s", Query: q("f", "secret")}), false, "GET /s blocked by deny rule"},
		{"deny query key missing", "GET", "/s", access("full", &sandboxv1.L7DenyRule{Method: "GET", Path: "/s", Query: q("f", "secret")}), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := decideREST(t, []*sandboxv1.NetworkEndpoint{restEP(tc.ep)}, tc.method, tc.target)
			if v.allowed != tc.allowed || v.reason != tc.reason || !v.enforce {
				t.Errorf("decideL7(%s %s) = %+v, want allowed %v reason %q enforce", tc.method, tc.target, v, tc.allowed, tc.reason)
			}
		})
	}
}

func TestL7Enforcement(t *testing.T) {
	for _, tc := range []struct {
		enforcement string
		enforce     bool
	}{{"enforce", true}, {"audit", false}, {"", false}} { // OpenShell's default is audit
		v := decideREST(t, []*sandboxv1.NetworkEndpoint{restEP(func(ep *sandboxv1.NetworkEndpoint) {
			ep.Enforcement, ep.Access = tc.enforcement, "read-only"
		})}, "POST", "/x")
		if v.allowed || v.enforce != tc.enforce {
			t.Errorf("enforcement %q: %+v, want denied, enforce %v", tc.enforcement, v, tc.enforce)
		}
	}
}

// A deny rule of another rule allowing the same caller and endpoint also
// applies (OpenShell's deny_request ranges over every matching policy).
func TestL7DenyAcrossRules(t *testing.T) {
	bin := []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}
	s := mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{
		"a": {Binaries: bin, Endpoints: []*sandboxv1.NetworkEndpoint{restEP(func(ep *sandboxv1.NetworkEndpoint) { ep.Access = "full" })}},
		"b": {Binaries: bin, Endpoints: []*sandboxv1.NetworkEndpoint{restEP(func(ep *sandboxv1.NetworkEndpoint) {
			ep.Access, ep.DenyRules = "read-only", []*sandboxv1.L7DenyRule{{Method: "DELETE", Path: "**"}}
		})}},
	})
	d := s.Decide(Request{Host: "api.example.com", Port: 80, Exe: "/usr/bin/curl"})
	if v := decideL7(d.l7, &l7Request{method: "DELETE", path: "/x"}); v.allowed {
		t.Errorf("DELETE allowed despite rule b's deny rule: %+v", v)
	}
	if v := decideL7(d.l7, &l7Request{method: "POST", path: "/x"}); !v.allowed {
		t.Errorf("POST denied though rule a allows everything: %+v", v)
	}
}

func TestCompileL7Refusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		ep   func(*sandboxv1.NetworkEndpoint)
		want string
	}{
		{"no access or rules", func(*sandboxv1.NetworkEndpoint) {}, "protocol rest without access or rules"},
		{"both", func(ep *sandboxv1.NetworkEndpoint) {
			ep.Access, ep.Rules = "full", []*sandboxv1.L7Rule{allow("GET", "**", nil)}
		}, "both access and rules"},
		{"unknown access", func(ep *sandboxv1.NetworkEndpoint) { ep.Access = "read-mostly" }, `access "read-mostly"`},
		{"unknown enforcement", func(ep *sandboxv1.NetworkEndpoint) { ep.Access, ep.Enforcement = "full", "block" }, `enforcement "block"`},
		{"rule without allow", func(ep *sandboxv1.NetworkEndpoint) { ep.Rules = []*sandboxv1.L7Rule{{}} }, "rules[0] without allow.method"},
		{"graphql matcher", func(ep *sandboxv1.NetworkEndpoint) {
			ep.Rules = []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "POST", OperationType: "query"}}}
		}, "rules[0] with non-REST matchers"},
		{"tls other", func(ep *sandboxv1.NetworkEndpoint) { ep.Access, ep.Tls = "full", "inspect" }, `tls "inspect" (want skip, terminate or passthrough)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Compile(map[string]*sandboxv1.NetworkPolicyRule{"api": {Endpoints: []*sandboxv1.NetworkEndpoint{restEP(tc.ep)}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/**"}}}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile error = %v, want one containing %q", err, tc.want)
			}
			if d := s.Decide(Request{Host: "api.example.com", Port: 80, Exe: "/bin/x"}); d.Allow {
				t.Errorf("a refused endpoint was allowed: %+v", d)
			}
		})
	}
	if _, err := Compile(map[string]*sandboxv1.NetworkPolicyRule{"api": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "a", Port: 80, Access: "full"}}}}); err == nil {
		t.Error("access without protocol rest accepted")
	}
}

func TestCanonicalPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		slash    bool
		err      bool
	}{
		{"", "/", false, false},
		{"/", "/", false, false},
		{"/a//b/", "/a/b/", false, false},
		{"/a/./b/../c", "/a/c", false, false},
		{"/a;x=1/b", "/a/b", false, false},
		{"/%2e%2e/x", "", false, true},
		{"/../x", "", false, true},
		{"/a%2Fb", "", false, true},
		{"/a%2Fb", "/a%2Fb", true, false},
		{"/a%252Fb", "/a%252Fb", true, false}, // a decoded '%' is re-encoded, not an encoded slash
		{"/a%00", "", false, true},
		{"/a%zz", "", false, true},
		{"/caf%C3%A9", "/caf%C3%A9", false, false},
		{"relative", "", false, true},
	} {
		got, err := canonicalPath(tc.in, tc.slash)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("canonicalPath(%q, %v) = %q, %v; want %q, error %v", tc.in, tc.slash, got, err, tc.want, tc.err)
		}
	}
}

// TestCanonicalPathFastPath: every path up to 7 bytes over an alphabet of
// the characters canonicalization treats specially is decided alike with
// and without the shortcut for paths already canonical.
func TestCanonicalPathFastPath(t *testing.T) {
	const alphabet = "/a.;%2F~ \x7f"
	var walk func(p string)
	n := 0
	walk = func(p string) {
		if isCanonicalPath(p) {
			n++
			if got, err := rebuildPath(p, false); err != nil || got != p {
				t.Errorf("isCanonicalPath(%q) but rebuildPath gives %q, %v", p, got, err)
			}
		}
		if len(p) == 7 {
			return
		}
		for i := 0; i < len(alphabet); i++ {
			walk(p + alphabet[i:i+1])
		}
	}
	walk("/")
	if n < 100 {
		t.Errorf("%d canonical paths seen, want the alphabet to give many", n)
	}
}
