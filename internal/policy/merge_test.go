package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
)

func ep(host string, port uint32) *sandboxv1.NetworkEndpoint {
	return &sandboxv1.NetworkEndpoint{Host: host, Port: port}
}

func bins(paths ...string) []*sandboxv1.NetworkBinary {
	var out []*sandboxv1.NetworkBinary
	for _, p := range paths {
		out = append(out, &sandboxv1.NetworkBinary{Path: p})
	}
	return out
}

func addRule(name string, r *sandboxv1.NetworkPolicyRule) *openshellv1.PolicyMergeOperation {
	return &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_AddRule{AddRule: &openshellv1.AddNetworkRule{RuleName: name, Rule: r}}}
}

func restEndpoint() *sandboxv1.NetworkEndpoint {
	return &sandboxv1.NetworkEndpoint{Host: "api.github.com", Port: 443, Protocol: "rest", Access: "read-only"}
}

func base() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh":   {Name: "gh", Endpoints: []*sandboxv1.NetworkEndpoint{restEndpoint()}, Binaries: bins("/usr/bin/gh")},
		"any":  {Name: "any", Endpoints: []*sandboxv1.NetworkEndpoint{ep("pypi.org", 443)}},
		"pair": {Name: "pair", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "multi.test", Port: 80, Ports: []uint32{80, 443}}}, Binaries: bins("/usr/bin/curl")},
	}}
}

// TestMerge: each operation's effect and OpenShell's refusals; a refused
// batch changes nothing.
func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []*openshellv1.PolicyMergeOperation
		want func(p *sandboxv1.SandboxPolicy) // edits base() into the expected result
		code error
		msg  string
	}{
		{name: "add a new rule", ops: []*openshellv1.PolicyMergeOperation{addRule("new", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("a.test", 443)}, Binaries: bins("/usr/bin/curl")})},
			want: func(p *sandboxv1.SandboxPolicy) {
				p.NetworkPolicies["new"] = &sandboxv1.NetworkPolicyRule{Name: "new", Endpoints: []*sandboxv1.NetworkEndpoint{ep("a.test", 443)}, Binaries: bins("/usr/bin/curl")}
			}},
		{name: "a new name sharing an endpoint stays its own rule", ops: []*openshellv1.PolicyMergeOperation{addRule("gh2", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{restEndpoint()}, Binaries: bins("/usr/bin/git")})},
			want: func(p *sandboxv1.SandboxPolicy) {
				p.NetworkPolicies["gh2"] = &sandboxv1.NetworkPolicyRule{Name: "gh2", Endpoints: []*sandboxv1.NetworkEndpoint{restEndpoint()}, Binaries: bins("/usr/bin/git")}
			}},
		{name: "existing rule, binary declared with all endpoints", ops: []*openshellv1.PolicyMergeOperation{addRule("gh", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{restEndpoint()}, Binaries: bins("/usr/bin/git")})},
			want: func(p *sandboxv1.SandboxPolicy) {
				p.NetworkPolicies["gh"].Binaries = bins("/usr/bin/gh", "/usr/bin/git")
			}},
		{name: "existing rule, endpoint declared for all binaries", ops: []*openshellv1.PolicyMergeOperation{addRule("gh", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("uploads.github.com", 443)}, Binaries: bins("/usr/bin/gh")})},
			want: func(p *sandboxv1.SandboxPolicy) {
				p.NetworkPolicies["gh"].Endpoints = append(p.NetworkPolicies["gh"].Endpoints, ep("uploads.github.com", 443))
			}},
		{name: "new binary would inherit undeclared endpoints", ops: []*openshellv1.PolicyMergeOperation{addRule("gh", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("other.test", 443)}, Binaries: bins("/usr/bin/gh", "/usr/bin/nc")})},
			code: errdefs.ErrFailedPrecondition, msg: "merge operation 0 add-rule 'gh' would grant /usr/bin/nc undeclared authorization for api.github.com on ports [443]"},
		{name: "existing binaries would gain the new endpoint", ops: []*openshellv1.PolicyMergeOperation{addRule("pair", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("x.test", 80)}, Binaries: bins("/usr/bin/wget")})},
			code: errdefs.ErrFailedPrecondition, msg: "merge operation 0 add-rule 'pair' would grant /usr/bin/wget undeclared authorization for multi.test on ports [80, 443]"},
		{name: "any-binary rule gains an endpoint", ops: []*openshellv1.PolicyMergeOperation{addRule("any", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("files.pythonhosted.org", 443)}, Binaries: bins("/usr/bin/pip")})},
			code: errdefs.ErrFailedPrecondition, msg: "merge operation 0 add-rule 'any' would grant existing binaries new or changed authorization for files.pythonhosted.org on ports [443]; also declare the existing any-binary scope"},
		{name: "remove one port of an endpoint", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveEndpoint{RemoveEndpoint: &openshellv1.RemoveNetworkEndpoint{Host: "multi.test", Port: 443}}}},
			want: func(p *sandboxv1.SandboxPolicy) { p.NetworkPolicies["pair"].Endpoints[0].Ports = []uint32{80} }},
		{name: "remove the last endpoint removes the rule", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveEndpoint{RemoveEndpoint: &openshellv1.RemoveNetworkEndpoint{RuleName: "any", Host: "PyPI.org", Port: 443}}}},
			want: func(p *sandboxv1.SandboxPolicy) { delete(p.NetworkPolicies, "any") }},
		{name: "remove rule", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "gh"}}}},
			want: func(p *sandboxv1.SandboxPolicy) { delete(p.NetworkPolicies, "gh") }},
		{name: "add allow rules expands the preset", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddAllowRules{AddAllowRules: &openshellv1.AddAllowRules{Host: "api.github.com", Port: 443,
			Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "PUT", Path: "/repos/**"}}}}}}},
			want: func(p *sandboxv1.SandboxPolicy) {
				e := p.NetworkPolicies["gh"].Endpoints[0]
				e.Access = ""
				for _, m := range []string{"GET", "HEAD", "OPTIONS"} {
					e.Rules = append(e.Rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: m, Path: "**"}})
				}
				e.Rules = append(e.Rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: "PUT", Path: "/repos/**"}})
			}},
		{name: "add deny rules", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddDenyRules{AddDenyRules: &openshellv1.AddDenyRules{Host: "api.github.com", Port: 443,
			DenyRules: []*sandboxv1.L7DenyRule{{Method: "DELETE", Path: "**"}}}}}},
			want: func(p *sandboxv1.SandboxPolicy) {
				p.NetworkPolicies["gh"].Endpoints[0].DenyRules = []*sandboxv1.L7DenyRule{{Method: "DELETE", Path: "**"}}
			}},
		{name: "deny rules on an uninspected endpoint", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddDenyRules{AddDenyRules: &openshellv1.AddDenyRules{Host: "pypi.org", Port: 443,
			DenyRules: []*sandboxv1.L7DenyRule{{Method: "DELETE", Path: "**"}}}}}},
			code: errdefs.ErrFailedPrecondition, msg: "endpoint pypi.org:443 has no L7 inspection configured (protocol is empty)"},
		{name: "allow rules on a missing endpoint", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddAllowRules{AddAllowRules: &openshellv1.AddAllowRules{Host: "nope.test", Port: 443,
			Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET"}}}}}}},
			code: errdefs.ErrFailedPrecondition, msg: "endpoint nope.test:443 was not found in the current policy"},
		{name: "remove binary", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveBinary{RemoveBinary: &openshellv1.RemoveNetworkBinary{RuleName: "gh", BinaryPath: "/usr/bin/gh"}}}},
			want: func(p *sandboxv1.SandboxPolicy) { delete(p.NetworkPolicies, "gh") }},
		{name: "remove binary from an any-binary rule", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveBinary{RemoveBinary: &openshellv1.RemoveNetworkBinary{RuleName: "any", BinaryPath: "/usr/bin/pip"}}}},
			code: errdefs.ErrFailedPrecondition, msg: "merge operation 0 cannot remove binary '/usr/bin/pip' from rule 'any' because the rule authorizes any binary; replace the policy with an explicit binary list or remove the rule"},
		{name: "a later refusal undoes the earlier operations", ops: []*openshellv1.PolicyMergeOperation{
			{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "gh"}}},
			{Operation: &openshellv1.PolicyMergeOperation_RemoveBinary{RemoveBinary: &openshellv1.RemoveNetworkBinary{RuleName: "any", BinaryPath: "/x"}}}},
			code: errdefs.ErrFailedPrecondition, msg: "merge operation 1 cannot remove binary"},
		{name: "add rule without endpoints", ops: []*openshellv1.PolicyMergeOperation{addRule("x", &sandboxv1.NetworkPolicyRule{})},
			code: errdefs.ErrInvalidArgument, msg: "merge_operations[0].add_rule.rule must contain at least one endpoint"},
		{name: "remove endpoint without port", ops: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveEndpoint{RemoveEndpoint: &openshellv1.RemoveNetworkEndpoint{Host: "a"}}}},
			code: errdefs.ErrInvalidArgument, msg: "merge_operations[0].remove_endpoint requires host and non-zero port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			got, err := policy.Merge(in, tc.ops)
			if !proto.Equal(in, base()) {
				t.Fatalf("Merge changed its input")
			}
			if tc.code != nil {
				if !errors.Is(err, tc.code) || (err == nil || !strings.Contains(err.Error(), tc.msg)) {
					t.Fatalf("Merge = %v, want %v containing %q", err, tc.code, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			want := base()
			tc.want(want)
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Errorf("Merge (-want +got):\n%s", d)
			}
		})
	}
}

// TestApplyLosesNoUpdate: concurrent merges on one sandbox each re-apply
// to the revision that beat them, so every rule they add is in the newest
// policy (before revision rows were named after their version, a writer
// stacked its revision on a policy it had not read, dropping the other's
// rule).
func TestApplyLosesNoUpdate(t *testing.T) {
	h, s := newHistory(t)
	sb := createRow(t, s, "race", livePolicy())
	const writers = 6
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Go(func() {
			name := fmt.Sprintf("r%d", i)
			_, err := h.Apply(t.Context(), sb, func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
				return policy.Merge(cur, []*openshellv1.PolicyMergeOperation{addRule(name, &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep(name+".test", 443)}})})
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrConflict): // gave up after its retries: allowed, but then its rule is absent
		default:
			t.Fatalf("Apply: %v", err)
		}
	}
	latest, err := h.Latest(t.Context(), sb)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(latest.GetPolicy().GetNetworkPolicies()) - 1; got != ok || latest.GetVersion() != uint32(ok+1) {
		t.Fatalf("newest revision v%d has %d added rules, want %d (one per successful writer, at v%d)", latest.GetVersion(), got, ok, ok+1)
	}
	if ok < 2 {
		t.Fatalf("only %d of %d writers succeeded", ok, writers)
	}
}

func TestCovers(t *testing.T) {
	p := base()
	p.NetworkPolicies["gh"].Endpoints[0].AllowedIps = []string{"10.0.0.1"}
	for _, tc := range []struct {
		name string
		rule *sandboxv1.NetworkPolicyRule
		want bool
	}{
		{"same binary and endpoint", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "API.github.com", Port: 443}}, Binaries: bins("/usr/bin/gh")}, true},
		{"other binary", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.github.com", 443)}, Binaries: bins("/usr/bin/curl")}, false},
		{"any-binary rule covers every binary", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("pypi.org", 443)}, Binaries: bins("/usr/bin/pip")}, true},
		{"any-binary proposal needs an any-binary rule", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("api.github.com", 443)}}, false},
		{"one of two ports", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{ep("multi.test", 443)}, Binaries: bins("/usr/bin/curl")}, true},
		{"a port not granted", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "multi.test", Ports: []uint32{443, 8443}}}, Binaries: bins("/usr/bin/curl")}, false},
		{"allowed_ips contained", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, AllowedIps: []string{"10.0.0.1"}}}, Binaries: bins("/usr/bin/gh")}, true},
		{"allowed_ips not contained", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443, AllowedIps: []string{"10.0.0.2"}}}}, false},
		{"an L7 rule not granted", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Protocol: "rest",
			Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "PUT", Path: "/x"}}}}}, Binaries: bins("/usr/bin/gh")}, false},
		{"another tls mode", &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443, Tls: "skip"}}}, false},
		{"no endpoints", &sandboxv1.NetworkPolicyRule{Binaries: bins("/usr/bin/gh")}, false},
	} {
		if got := policy.Covers(p, tc.rule); got != tc.want {
			t.Errorf("Covers(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
