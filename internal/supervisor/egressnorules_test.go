package supervisor

import (
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// TestEgressNoRulesSnapshot: a policy without network rules gets the
// snapshot compiled in the background at start, deciding as one compiled
// on demand (deny); a policy with rules is compiled as it is.
func TestEgressNoRulesSnapshot(t *testing.T) {
	e := &egressRunner{proxy: egress.New(egress.Config{}, nil)}
	e.prepareNoRules()
	req := egress.Request{Host: "api.github.com", Port: 443, Exe: "/usr/bin/git"}

	s1, err := e.compile(defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := e.compile(&sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{}})
	if err != nil {
		t.Fatal(err)
	}
	if s1 == nil || s1 != s2 {
		t.Fatalf("policies without network rules: snapshots %p and %p, want the prepared one", s1, s2)
	}
	fresh, err := egress.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s1.Decide(req), fresh.Decide(req); got.Allow || got.Reason != want.Reason {
		t.Fatalf("prepared snapshot decides %+v, a fresh one %+v", got, want)
	}

	withRules := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/git"}}},
	}}
	s3, err := e.compile(withRules)
	if err != nil {
		t.Fatal(err)
	}
	if s3 == s1 || !s3.Decide(req).Allow {
		t.Fatalf("policy with a rule: decision %+v, want allowed by its own snapshot", s3.Decide(req))
	}
	if err := e.load(defaultPolicy()); err != nil {
		t.Fatal(err)
	}
}
