package providers

import (
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/providers/profiles"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// TestComposableEndpointsAreEnforced: the endpoints of every built-in
// profile that composition keeps compile in the egress proxy without a
// problem (a composed policy can be reported LOADED), and those it leaves
// out would not.
func TestComposableEndpointsAreEnforced(t *testing.T) {
	c := profiles.Builtin()
	kept, left := 0, 0
	for _, id := range c.IDs() {
		p, _ := c.Get(id)
		for _, e := range p.GetEndpoints() {
			rule := map[string]*sandboxv1.NetworkPolicyRule{"r": {Endpoints: []*sandboxv1.NetworkEndpoint{e}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/x"}}}}
			_, err := egress.Compile(rule)
			if composable(e) {
				kept++
				if err != nil {
					t.Errorf("%s endpoint %s is composed but not enforced: %v", id, e.GetHost(), err)
				}
			} else {
				left++
				if err == nil {
					t.Errorf("%s endpoint %s is enforced but left out of composition", id, e.GetHost())
				}
			}
		}
	}
	if kept == 0 || left == 0 {
		t.Errorf("kept %d, left out %d endpoints; the built-in profiles have both kinds", kept, left)
	}
}

func TestProviderRuleName(t *testing.T) {
	for in, want := range map[string]string{"my.gh": "_provider_my_gh", "GH": "_provider_gh", "--": "_provider_unnamed", "a_b-c": "_provider_a_b_c"} {
		if got := ProviderRuleName(in); got != want {
			t.Errorf("ProviderRuleName(%q) = %q, want %q", in, got, want)
		}
	}
}
