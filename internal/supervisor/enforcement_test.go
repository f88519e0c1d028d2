package supervisor

import (
	"errors"
	"strings"
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
		{"default policy", defaultPolicy(), ""},
		{"process", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "sandbox"}}, ""},
		{"confinement failed", &sandboxv1.SandboxPolicy{Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"}},
			"agent confinement failed, no agent process starts: landlock path /x: no such file or directory"},
		{"confinement failed and network rules", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"pypi": {}}},
			"agent confinement failed, no agent process starts: landlock path /x: no such file or directory; " +
				"network policies are not enforced by this supervisor: there is no egress proxy (rules: pypi)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var confErr error
			if strings.HasPrefix(tt.want, "agent confinement failed") {
				confErr = errors.New("landlock path /x: no such file or directory")
			}
			err := enforcement(tt.policy, confErr)
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
