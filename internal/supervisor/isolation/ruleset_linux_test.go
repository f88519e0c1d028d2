package isolation

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/citest"
)

// TestBuildRulesetScopesOnly: under best effort, when no rule path can be
// opened, the agent still gets a ruleset on an ABI with scopes (signals
// and abstract unix sockets stay confined) and none before it.
func TestBuildRulesetScopesOnly(t *testing.T) {
	abi := LandlockABI()
	if abi < 1 {
		citest.SkipOrFail(t, "kernel without Landlock")
	}
	spec := LandlockSpec{ReadOnly: []Path{{Path: "/does/not/exist"}}}
	for _, a := range []int{5, abi} {
		if a > abi {
			continue
		}
		fd, skipped, err := buildRuleset(spec, a)
		if fd >= 0 {
			unix.Close(fd) //nolint:errcheck // only a check
		}
		if err != nil || len(skipped) != 1 {
			t.Fatalf("buildRuleset(abi %d) = %d, %v, %v; want /does/not/exist skipped", a, fd, skipped, err)
		}
		if want := a >= 6; (fd >= 0) != want {
			t.Errorf("buildRuleset(abi %d) returned fd %d, want a scope-only ruleset: %v", a, fd, want)
		}
	}
}
