package policy

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func baselinePolicy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version:    1,
		Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr", "/etc"}, ReadWrite: []string{"/tmp"}},
		Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
		Process:    &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "sandbox"},
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}},
		},
	}
}

func TestValidateUpdate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(p *sandboxv1.SandboxPolicy)
		want   string // "" = accepted
	}{
		{"unchanged", func(*sandboxv1.SandboxPolicy) {}, ""},
		{"network rule added", func(p *sandboxv1.SandboxPolicy) {
			p.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}
		}, ""},
		{"network rules removed", func(p *sandboxv1.SandboxPolicy) { p.NetworkPolicies = nil }, ""},
		{"include_workdir", func(p *sandboxv1.SandboxPolicy) { p.Filesystem.IncludeWorkdir = false },
			"filesystem include_workdir cannot be changed on a live sandbox"},
		{"read_only path removed", func(p *sandboxv1.SandboxPolicy) { p.Filesystem.ReadOnly = []string{"/usr"} },
			"filesystem read_only path '/etc' cannot be removed on a live sandbox"},
		{"read_write path added", func(p *sandboxv1.SandboxPolicy) { p.Filesystem.ReadWrite = append(p.Filesystem.ReadWrite, "/var") },
			"filesystem read_write path '/var' cannot be added on a live sandbox"},
		{"filesystem removed", func(p *sandboxv1.SandboxPolicy) { p.Filesystem = nil },
			"filesystem policy cannot be removed on a live sandbox"},
		{"landlock", func(p *sandboxv1.SandboxPolicy) { p.Landlock.Compatibility = "hard_requirement" },
			"landlock policy cannot be changed on a live sandbox (applied at startup)"},
		{"landlock removed", func(p *sandboxv1.SandboxPolicy) { p.Landlock = nil },
			"landlock policy cannot be changed on a live sandbox (applied at startup)"},
		{"run_as_user", func(p *sandboxv1.SandboxPolicy) { p.Process.RunAsUser = "1000" },
			"process policy cannot be changed on a live sandbox (applied at startup)"},
		{"every static section and an unsafe rule at once", func(p *sandboxv1.SandboxPolicy) {
			p.Filesystem.IncludeWorkdir = false
			p.Filesystem.ReadOnly = []string{"/usr", "/etc", "/root"}
			p.Landlock = nil
			p.Process.RunAsUser = "root"
			p.NetworkPolicies["gh"].Endpoints[0].Host = "*.com"
		}, "filesystem include_workdir cannot be changed on a live sandbox; " +
			"filesystem read_only path '/root' cannot be added on a live sandbox; " +
			"landlock policy cannot be changed on a live sandbox (applied at startup); " +
			"process policy cannot be changed on a live sandbox (applied at startup); " +
			"policy contains unsafe content: run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'; " +
			"network policy 'gh': TLD wildcard '*.com' is not allowed; use subdomain wildcards like '*.example.com' instead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := proto.Clone(baselinePolicy()).(*sandboxv1.SandboxPolicy)
			tt.mutate(next)
			err := ValidateUpdate(baselinePolicy(), next)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidateUpdate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tt.want {
				t.Errorf("ValidateUpdate() = %v, want InvalidArgument %q", err, tt.want)
			}
		})
	}
}

func TestValidateUpdateAbsentEqualsEmpty(t *testing.T) {
	base := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{}}
	next := &sandboxv1.SandboxPolicy{Filesystem: &sandboxv1.FilesystemPolicy{}, Landlock: &sandboxv1.LandlockPolicy{}, Process: &sandboxv1.ProcessPolicy{}}
	if err := ValidateUpdate(base, next); err != nil {
		t.Errorf("ValidateUpdate(absent sections, empty sections) = %v, want nil", err)
	}
	next.Filesystem.ReadOnly = []string{"/usr"}
	want := "filesystem read_only path '/usr' cannot be added on a live sandbox"
	if err := ValidateUpdate(base, next); err == nil || err.Error() != want {
		t.Errorf("ValidateUpdate(no filesystem, one path) = %v, want %q", err, want)
	}
}

func TestValidateUpdateWithoutBaselineChecksSafetyOnly(t *testing.T) {
	if err := ValidateUpdate(nil, baselinePolicy()); err != nil {
		t.Errorf("ValidateUpdate(nil, safe) = %v, want nil", err)
	}
	p := baselinePolicy()
	p.Filesystem.ReadWrite = []string{"/"}
	want := "policy contains unsafe content: read-write path is overly broad: /"
	if err := ValidateUpdate(nil, p); err == nil || err.Error() != want {
		t.Errorf("ValidateUpdate(nil, rw /) = %v, want %q", err, want)
	}
}
