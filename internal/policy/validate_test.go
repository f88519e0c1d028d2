package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func fsPolicy(ro, rw []string) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: ro, ReadWrite: rw}}
}

func netPolicy(eps ...*sandboxv1.NetworkEndpoint) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"api": {Endpoints: eps},
	}}
}

func TestViolations(t *testing.T) {
	long := "/" + strings.Repeat("a", MaxPathLength)
	many := make([]string, MaxFilesystemPaths+1)
	for i := range many {
		many[i] = "/p"
	}
	tests := []struct {
		name   string
		policy *sandboxv1.SandboxPolicy
		want   []string
	}{
		{"nil policy", nil, nil},
		{"empty policy", &sandboxv1.SandboxPolicy{}, nil},
		{"safe policy", &sandboxv1.SandboxPolicy{
			Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr", "/etc/"}, ReadWrite: []string{"/tmp", "/sandbox"}},
			Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
			Process:    &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "1000"},
			NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "api.github.com", Port: 443},
				{Host: "*.example.com", Ports: []uint32{80, 443}},
				{Host: "**.example.com", Port: 443},
				{Host: "*-aiplatform.googleapis.com", Port: 443},
				{Host: "*.s3.*.amazonaws.com", Port: 443},
				{Host: "10.0.0.1", Port: 5432},
				{AllowedIps: []string{"10.0.0.0/8"}, Port: 53},
				{Host: "db.internal", Port: 5432, Protocol: "tcp"},
			}}},
		}, nil},
		{"root user", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "root"}},
			[]string{"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'"}},
		{"uid 0 and sentinel gid", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "0", RunAsGroup: "4294967295"}},
			[]string{
				"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got '0'",
				"run_as_group must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got '4294967295'",
			}},
		{"named group and negative user", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "-1", RunAsGroup: "nobody"}},
			[]string{
				"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got '-1'",
				"run_as_group must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'nobody'",
			}},
		{"bounds accepted", &sandboxv1.SandboxPolicy{Process: &sandboxv1.ProcessPolicy{RunAsUser: "1", RunAsGroup: "4294967294"}}, nil},
		{"traversal", fsPolicy([]string{"/usr/../etc/shadow"}, nil),
			[]string{"path contains '..' traversal component: /usr/../etc/shadow"}},
		{"dots that are not traversal", fsPolicy([]string{"/a/..b", "/a/.../c", "/a/./b"}, nil), nil},
		{"relative", fsPolicy([]string{"etc"}, []string{"../tmp"}),
			[]string{
				"path must be absolute (start with '/'): etc",
				"path must be absolute (start with '/'): ../tmp",
				"path contains '..' traversal component: ../tmp",
			}},
		{"root read-write", fsPolicy([]string{"/"}, []string{"/", "//"}),
			[]string{"read-write path is overly broad: /", "read-write path is overly broad: //"}},
		{"path too long", fsPolicy([]string{long}, nil),
			[]string{"path exceeds maximum length (4097 > 4096): " + long[:77] + "..."}},
		{"too many paths", fsPolicy(many[:200], many[200:]),
			[]string{"too many filesystem paths (257 > 256)"}},
		{"misspelt landlock compatibility", &sandboxv1.SandboxPolicy{Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard-requirement"}},
			[]string{"landlock compatibility must be 'best_effort' or 'hard_requirement', got 'hard-requirement'"}},
		{"landlock best effort", &sandboxv1.SandboxPolicy{Landlock: &sandboxv1.LandlockPolicy{Compatibility: "best_effort"}}, nil},
		{"tld wildcard", netPolicy(&sandboxv1.NetworkEndpoint{Host: "*.com", Port: 443}),
			[]string{"network policy 'api': TLD wildcard '*.com' is not allowed; use subdomain wildcards like '*.example.com' instead"}},
		{"recursive tld wildcard", netPolicy(&sandboxv1.NetworkEndpoint{Host: "**.com", Port: 443}),
			[]string{"network policy 'api': TLD wildcard '**.com' is not allowed; use subdomain wildcards like '*.example.com' instead"}},
		{"match everything", netPolicy(&sandboxv1.NetworkEndpoint{Host: "*", Port: 443}, &sandboxv1.NetworkEndpoint{Host: "**", Port: 443}),
			[]string{
				"network policy 'api': invalid host wildcard '*'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label",
				"network policy 'api': invalid host wildcard '**'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label",
			}},
		{"bad wildcard shapes", netPolicy(
			&sandboxv1.NetworkEndpoint{Host: "foo.us-*.example.com", Port: 443},
			&sandboxv1.NetworkEndpoint{Host: "foo.**.example.com", Port: 443},
			&sandboxv1.NetworkEndpoint{Host: "foo**.example.com", Port: 443}),
			[]string{
				"network policy 'api': invalid host wildcard 'foo.us-*.example.com'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label",
				"network policy 'api': invalid host wildcard 'foo.**.example.com'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label",
				"network policy 'api': invalid host wildcard 'foo**.example.com'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label",
			}},
		{"no port", netPolicy(&sandboxv1.NetworkEndpoint{Host: "api.example.com"}),
			[]string{"network policy 'api': endpoint 'api.example.com' must declare at least one port"}},
		{"port out of range", netPolicy(&sandboxv1.NetworkEndpoint{Host: "api.example.com", Ports: []uint32{0, 65536}}),
			[]string{
				"network policy 'api': endpoint 'api.example.com' has invalid port 0; expected 1..=65535",
				"network policy 'api': endpoint 'api.example.com' has invalid port 65536; expected 1..=65535",
			}},
		{"no host", netPolicy(&sandboxv1.NetworkEndpoint{Port: 443}),
			[]string{"network policy 'api': endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint"}},
		{"tcp without host", netPolicy(&sandboxv1.NetworkEndpoint{Protocol: "tcp", AllowedIps: []string{"10.0.0.0/8"}, Port: 22}),
			[]string{"network policy 'api': protocol tcp requires a DNS hostname; hostless allowed_ips endpoints are supported only by the forward proxy"}},
		{"tcp ip literal", netPolicy(&sandboxv1.NetworkEndpoint{Protocol: "TCP", Host: "10.1.2.3", Port: 22}),
			[]string{"network policy 'api': protocol tcp endpoint '10.1.2.3' must use a DNS hostname, not an IP literal; direct IP connections bypass policy DNS and are blocked"}},
		{"tcp root dot", netPolicy(&sandboxv1.NetworkEndpoint{Protocol: "tcp", Host: "db.internal.", Port: 22}),
			[]string{"network policy 'api': protocol tcp endpoint has invalid DNS host selector 'db.internal.': omit the trailing DNS root dot"}},
		{"rule name wins over key", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"k": {Name: "named", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "*.io", Port: 1}}},
		}}, []string{"network policy 'named': TLD wildcard '*.io' is not allowed; use subdomain wildcards like '*.example.com' instead"}},
		{"credential signing", netPolicy(
			&sandboxv1.NetworkEndpoint{Host: "s3.amazonaws.com", Port: 443, CredentialSigning: "sigv2", RequestBodyCredentialRewrite: true}),
			[]string{
				"network policy 'api': endpoint 's3.amazonaws.com' has unrecognized credential_signing value 'sigv2' (expected sigv4, sigv4:body, or sigv4:no_body)",
				"network policy 'api': endpoint 's3.amazonaws.com' has credential_signing set but signing_service is empty",
				"network policy 'api': endpoint 's3.amazonaws.com' has both credential_signing and request_body_credential_rewrite set; these options are mutually exclusive",
			}},
		{"every section at once", &sandboxv1.SandboxPolicy{
			Process:         &sandboxv1.ProcessPolicy{RunAsUser: "root"},
			Filesystem:      &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr/../etc/shadow"}, ReadWrite: []string{"/"}},
			NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"b": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "*.com"}}}, "a": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "x.io"}}}},
		}, []string{
			"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'",
			"path contains '..' traversal component: /usr/../etc/shadow",
			"read-write path is overly broad: /",
			"network policy 'a': endpoint 'x.io' must declare at least one port",
			"network policy 'b': endpoint '*.com' must declare at least one port",
			"network policy 'b': TLD wildcard '*.com' is not allowed; use subdomain wildcards like '*.example.com' instead",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Violations(tt.policy)); diff != "" {
				t.Errorf("Violations() mismatch (-want +got):\n%s", diff)
			}
			err := Validate(tt.policy)
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate() = %v, want an InvalidArgument error", err)
			}
			if want := "policy contains unsafe content: " + strings.Join(tt.want, "; "); err.Error() != want {
				t.Errorf("Validate() = %q, want %q", err, want)
			}
		})
	}
}

func TestTruncateForDisplayKeepsRunes(t *testing.T) {
	s := strings.Repeat("a", 76) + "é" + strings.Repeat("b", 10) // é straddles byte 77
	got := truncateForDisplay(s)
	if want := strings.Repeat("a", 76) + "..."; got != want {
		t.Errorf("truncateForDisplay() = %q, want %q", got, want)
	}
}
