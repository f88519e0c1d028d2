package advisor

import (
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func pol(rules map[string]*sandboxv1.NetworkPolicyRule) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{NetworkPolicies: rules}
}

func rule(bin string, eps ...*sandboxv1.NetworkEndpoint) *sandboxv1.NetworkPolicyRule {
	r := &sandboxv1.NetworkPolicyRule{Endpoints: eps}
	if bin != "" {
		r.Binaries = []*sandboxv1.NetworkBinary{{Path: bin}}
	}
	return r
}

func TestValidationResult(t *testing.T) {
	gh := &sandboxv1.NetworkEndpoint{Host: "api.github.com", Port: 443, Protocol: "rest", Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "**"}}}}
	ghPut := &sandboxv1.NetworkEndpoint{Host: "api.github.com", Port: 443, Protocol: "rest", Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "**"}}, {Allow: &sandboxv1.L7Allow{Method: "put", Path: "/x"}}}}
	creds := []string{"*.github.com"}
	base := pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh)})
	for _, tc := range []struct {
		name      string
		cur, cand *sandboxv1.SandboxPolicy
		want      string
	}{
		{"uncredentialed reach", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh), "p": rule("/usr/bin/pip", &sandboxv1.NetworkEndpoint{Host: "pypi.org", Port: 443})}),
			NoNewFindings},
		{"metadata hostname and link-local address", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh),
			"m": rule("/usr/bin/curl", &sandboxv1.NetworkEndpoint{Host: "Metadata.Google.Internal", Port: 80}, &sandboxv1.NetworkEndpoint{Host: "169.254.169.254", Port: 80})}),
			"prover: 1 new finding\n  link_local_reach: 169.254.169.254:80 via /usr/bin/curl\n  link_local_reach: metadata.google.internal:80 via /usr/bin/curl"},
		{"new credentialed reach hides its methods", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh), "c": rule("/usr/bin/curl", gh)}),
			"prover: 1 new finding\n  credential_reach_expansion: api.github.com:443 via /usr/bin/curl"},
		{"new method on credentialed reach", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", ghPut)}),
			"prover: 1 new finding\n  capability_expansion: PUT on api.github.com:443 via /usr/bin/gh"},
		{"uninspectable binary", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh), "s": rule("/usr/bin/ssh", &sandboxv1.NetworkEndpoint{Host: "ssh.github.com", Port: 22})}),
			"prover: 1 new finding\n  l7_bypass_credentialed: ssh.github.com:22 via /usr/bin/ssh"},
		{"any binary, two categories", base, pol(map[string]*sandboxv1.NetworkPolicyRule{"gh": rule("/usr/bin/gh", gh),
			"x": rule("", &sandboxv1.NetworkEndpoint{Host: "uploads.github.com", Port: 443}, &sandboxv1.NetworkEndpoint{Host: "fe80::1", Port: 80})}),
			"prover: 2 new findings\n  link_local_reach: fe80::1:80 via *\n  credential_reach_expansion: uploads.github.com:443 via *"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ValidationResult(tc.cur, tc.cand, creds); got != tc.want {
				t.Errorf("ValidationResult =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestSecurityNotes(t *testing.T) {
	for _, tc := range []struct {
		ep   *sandboxv1.NetworkEndpoint
		want string
	}{
		{&sandboxv1.NetworkEndpoint{Host: "pypi.org", Port: 443}, ""},
		{&sandboxv1.NetworkEndpoint{Host: "10.1.2.3", Port: 5432}, "Destination '10.1.2.3' appears to be an internal/private address. Port 5432 is a well-known database/service port."},
		{&sandboxv1.NetworkEndpoint{Host: "127.0.0.1", Port: 80}, ""}, // always blocked: not advisory
		{&sandboxv1.NetworkEndpoint{Host: "*.example.com", Port: 60000}, "Host '*.example.com' contains a wildcard — this may match unintended destinations. Port 60000 is in the ephemeral range — this may be a temporary service."},
		{&sandboxv1.NetworkEndpoint{Port: 443, AllowedIps: []string{"192.168.0.0/16"}}, "allowed_ips includes private/internal range '192.168.0.0/16'. allowed_ips allowlist is hostless and may match any hostname resolving within the configured range."},
	} {
		if got := SecurityNotes(rule("/usr/bin/curl", tc.ep)); got != tc.want {
			t.Errorf("SecurityNotes(%v) = %q, want %q", tc.ep, got, tc.want)
		}
	}
}

func TestFromSummaries(t *testing.T) {
	got := FromSummaries([]*openshellv1.DenialSummary{
		{Binary: "/usr/bin/curl", Host: "Files.Python-Hosted.org", Port: 443, Count: 4, DenyReason: "no rule"},
		{Host: "x.test", Port: 443, Count: 1},          // no binary: would allow every binary
		{Binary: "/usr/bin/curl", Port: 443, Count: 1}, // no host
		{Binary: "/usr/bin/curl", Host: "127.0.0.2", Port: 80, Count: 1},
		{Binary: "/usr/bin/curl", Host: "localhost", Port: 80, Count: 1},
	})
	if len(got) != 1 {
		t.Fatalf("FromSummaries = %v, want one chunk", got)
	}
	c := got[0]
	if c.GetRuleName() != "allow_files_python_hosted_org_443" || c.GetHitCount() != 4 || c.GetProposedRule().GetEndpoints()[0].GetHost() != "files.python-hosted.org" ||
		c.GetProposedRule().GetBinaries()[0].GetPath() != "/usr/bin/curl" || c.GetRationale() != "Allow curl to connect to files.python-hosted.org:443 (HTTPS)." || c.GetConfidence() != 0.75 {
		t.Errorf("chunk = %v", c)
	}
}
