package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestEgressL7REST: a real gateway and supervisor, curl in the sandbox and
// a loopback upstream of this test. An endpoint with protocol: rest,
// access: read-only, a deny rule and enforcement: enforce is reported
// LOADED; GET is forwarded, POST and a GET matching the deny rule get
// OpenShell's JSON 403 and never reach the upstream; an audit endpoint
// forwards a POST; an endpoint with a path and query allow rule and a
// query deny rule forwards only the GET matching both and answers 403 to
// a query value outside the list, a missing key, a path glob crossing /,
// another path and the deny rule's query; every decision is in the log stream with method and
// canonical path, never the query.
func TestEgressL7REST(t *testing.T) {
	curl := requireCurl(t)
	_, seen, port, portN := recordingUpstream(t, false)

	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=api.l7.test=127.0.0.1,audit.l7.test=127.0.0.1,rules.l7.test=127.0.0.1"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"api": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "api.l7.test", Port: portN, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Enforcement: "enforce", Access: "read-only",
					DenyRules: []*sandboxv1.L7DenyRule{{Method: "GET", Path: "/admin/**"}}},
				{Host: "audit.l7.test", Port: portN, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Enforcement: "audit",
					Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "/**"}}}},
				// Path and query rules: GET of one repository's issues
				// with state open or closed, never with force=true.
				{Host: "rules.l7.test", Port: portN, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Enforcement: "enforce",
					Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "/repos/*/issues",
						Query: map[string]*sandboxv1.L7QueryMatcher{"state": {Any: []string{"open", "closed"}}}}}},
					DenyRules: []*sandboxv1.L7DenyRule{{Method: "*", Path: "/**", Query: map[string]*sandboxv1.L7QueryMatcher{"force": {Glob: "t*"}}}}},
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}},
		},
	})
	id := createEgressSandbox(ctx, t, c, "l7", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "l7", "protocol rest on plain HTTP is enforced")
	sh := func(script string) string {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out)
	}
	next := func() string {
		t.Helper()
		select {
		case got := <-seen:
			return got
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream received no request")
			return ""
		}
	}
	api := "http://api.l7.test:" + port
	if out := sh(curl + " -s -w ' %{http_code}' '" + api + "/repos/x?token=query-secret'"); out != "upstream GET /repos/x 200" {
		t.Errorf("GET = %q, want the upstream's 200", out)
	}
	if got := next(); got != "GET api.l7.test:"+port+" /repos/x" {
		t.Errorf("upstream saw %q", got)
	}
	if out := sh(curl + " -s -X POST -d data -w ' %{http_code}' " + api + "/repos/x"); !strings.HasSuffix(out, " 403") ||
		!strings.Contains(out, `"error":"policy_denied"`) || !strings.Contains(out, `"detail":"POST /repos/x not permitted by policy"`) {
		t.Errorf("POST = %q, want OpenShell's JSON 403", out)
	}
	if out := sh(curl + " -s -o /dev/null -w '%{http_code}' " + api + "/admin/users"); out != "403" {
		t.Errorf("GET under the deny rule = %q, want 403", out)
	}
	if out := sh(curl + " -s -X POST -d data -w ' %{http_code}' http://audit.l7.test:" + port + "/x"); out != "upstream POST /x 200" {
		t.Errorf("POST to the audit endpoint = %q, want forwarded", out)
	}
	if got := next(); got != "POST audit.l7.test:"+port+" /x" {
		t.Errorf("upstream saw %q after the denials, want only the audited POST", got)
	}
	rules := "http://rules.l7.test:" + port
	if out := sh(curl + " -s -w ' %{http_code}' '" + rules + "/repos/a/issues?state=open&page=2'"); out != "upstream GET /repos/a/issues 200" {
		t.Errorf("GET matching the path and query rule = %q, want the upstream's 200", out)
	}
	if got := next(); got != "GET rules.l7.test:"+port+" /repos/a/issues" {
		t.Errorf("upstream saw %q", got)
	}
	for target, why := range map[string]string{
		"/repos/a/issues?state=all":             "a query value outside the rule's list",
		"/repos/a/issues":                       "the rule's query key missing",
		"/repos/a/issues?state=open&state=all":  "one of the values outside the list",
		"/repos/a/b/issues?state=open":          "* does not cross /",
		"/repos/a/pulls?state=open":             "another path",
		"/repos/a/issues?state=open&force=true": "the deny rule's query",
	} {
		if out := sh(curl + " -s -o /dev/null -w '%{http_code}' '" + rules + target + "'"); out != "403" {
			t.Errorf("GET %s (%s) = %q, want 403", target, why, out)
		}
	}
	select {
	case got := <-seen:
		t.Errorf("upstream saw %q after the path and query denials", got)
	default:
	}

	want := map[string]func(f map[string]string) bool{
		"allow GET": func(f map[string]string) bool {
			return f["decision"] == "allow" && f["method"] == "GET" && f["path"] == "/repos/x" && f["policy"] == "api"
		},
		"deny POST": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["method"] == "POST" && f["path"] == "/repos/x" && f["reason"] == "POST /repos/x not permitted by policy"
		},
		"deny rule": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["path"] == "/admin/users" && f["reason"] == "GET /admin/users blocked by deny rule"
		},
		"deny query": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "rules.l7.test" && f["path"] == "/repos/a/issues" && f["reason"] == "GET /repos/a/issues not permitted by policy"
		},
		"deny query deny rule": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "rules.l7.test" && f["reason"] == "GET /repos/a/issues blocked by deny rule"
		},
		"audit POST": func(f map[string]string) bool {
			return f["decision"] == "audit" && f["host"] == "audit.l7.test" && f["method"] == "POST" && f["reason"] == "POST /x not permitted by policy"
		},
	}
	waitEgressEvents(ctx, t, c, id, want)
}
