package supervisor

import (
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
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
		{"network rules", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"pypi": {}, "github": {},
		}}, "network policies are not enforced by this supervisor: there is no egress proxy (rules: github, pypi)"},
		{"middlewares", &sandboxv1.SandboxPolicy{NetworkMiddlewares: map[string]*sandboxv1.NetworkMiddlewareConfig{"audit": {}}},
			"network middlewares are not enforced by this supervisor: there is no egress proxy (middlewares: audit)"},
		{"default policy", defaultPolicy(),
			"filesystem policy is not enforced by this supervisor: no Landlock ruleset is applied to the agent; " +
				"landlock policy is not enforced by this supervisor: Landlock is not applied"},
		{"process", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "sandbox"}},
			"process policy is not enforced by this supervisor: the agent runs as the supervisor's user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := enforcement(tt.policy)
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
