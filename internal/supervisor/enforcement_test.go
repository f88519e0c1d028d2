package supervisor

import (
	"errors"
	"strings"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

func TestEnforcement(t *testing.T) {
	tests := []struct {
		name   string
		policy *sandboxv1.SandboxPolicy
		want   string // "" = LOADED
	}{
		{"no policy", nil, ""},
		{"empty sections ask for nothing", &sandboxv1.SandboxPolicy{
			Version: 1, Filesystem: &sandboxv1.FilesystemPolicy{}, Landlock: &sandboxv1.LandlockPolicy{}, Process: &sandboxv1.ProcessPolicy{},
			NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{},
		}, ""},
		{"network rules, proxy enforcing them", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"pypi": {}, "github": {},
		}}, ""},
		{"network rules, no proxy", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"pypi": {}, "github": {},
		}}, "network policies are not enforced as written: no egress proxy runs (rules: github, pypi)"},
		{"middlewares", &sandboxv1.SandboxPolicy{NetworkMiddlewares: map[string]*sandboxv1.NetworkMiddlewareConfig{"audit": {}}},
			"network middlewares are not enforced by this supervisor: the egress proxy runs no middlewares (middlewares: audit)"},
		{"default policy", defaultPolicy(), ""},
		{"process", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "sandbox"}}, ""},
		{"confinement failed", &sandboxv1.SandboxPolicy{Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"}},
			"agent confinement failed, no agent process starts: landlock path /x: no such file or directory"},
		{"confinement failed and network rules", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"pypi": {}}},
			"agent confinement failed, no agent process starts: landlock path /x: no such file or directory; " +
				"network policies are not enforced as written: no egress proxy runs (rules: pypi)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var confErr, netErr error
			if strings.HasPrefix(tt.want, "agent confinement failed") {
				confErr = errors.New("landlock path /x: no such file or directory")
			}
			if strings.Contains(tt.want, "no egress proxy runs") {
				netErr = errors.New("no egress proxy runs")
			}
			err := enforcement(tt.policy, confErr, netErr)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("enforcement() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEgressLoadReports: network rules are LOADED only when the proxy runs
// and enforces every endpoint: protocol rest endpoints (with or without
// tls: terminate) are LOADED, tls: terminate without protocol
// rest is named in the FAILED reason.
func TestEgressLoadReports(t *testing.T) {
	plain := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/git"}}}}}
	l7 := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Tls: "terminate"}}}}}
	tlsRest := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Protocol: "rest", Tls: "terminate", Access: "read-only"}}}}}
	running := &egressRunner{proxy: egress.New(egress.Config{}, nil)}
	if err := enforcement(plain, nil, running.load(plain)); err != nil {
		t.Errorf("plain rules with a running proxy: %v, want LOADED", err)
	}
	rest := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 80, Protocol: "rest", Enforcement: "enforce", Access: "read-only",
			DenyRules: []*sandboxv1.L7DenyRule{{Method: "GET", Path: "/admin/**"}}}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}}
	if err := enforcement(rest, nil, running.load(rest)); err != nil {
		t.Errorf("protocol rest rules with a running proxy: %v, want LOADED", err)
	}
	if err := enforcement(tlsRest, nil, running.load(tlsRest)); err != nil {
		t.Errorf("protocol rest with tls terminate and a running proxy: %v, want LOADED", err)
	}
	want := `network policies are not enforced as written: rule "gh" endpoint "api.github.com" asks for tls "terminate" without protocol rest (only REST requests are inspected): ` +
		`not implemented by the egress proxy, those endpoints are denied (rules: gh)`
	if err := enforcement(l7, nil, running.load(l7)); err == nil || err.Error() != want {
		t.Errorf("L7 rules = %v, want %q", err, want)
	}
	stopped := &egressRunner{why: errors.New("no egress proxy runs: test")}
	if err := enforcement(plain, nil, stopped.load(plain)); err == nil || err.Error() != "network policies are not enforced as written: no egress proxy runs: test (rules: gh)" {
		t.Errorf("no proxy = %v", err)
	}
}
