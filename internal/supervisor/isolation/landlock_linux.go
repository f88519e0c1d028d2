package isolation

import (
	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/supervisor/isolation/trampoline"
)

// LandlockSpec is the Landlock part of a Spec.
type LandlockSpec = trampoline.LandlockSpec

// PathProblem is a rule path that cannot be used.
type PathProblem = trampoline.PathProblem

// LandlockABI is the kernel's Landlock ABI version, 0 when Landlock is not
// available (not built in, or not enabled at boot).
func LandlockABI() int { return trampoline.LandlockABI() }

// CheckLandlock reports, from the supervisor's point of view, what the
// trampoline will do with c's Landlock rules: the kernel's ABI and the
// paths it will skip. Under hard_requirement a problem is an error.
func (c *Confinement) CheckLandlock() (abi int, skipped []PathProblem, err error) {
	abi = LandlockABI()
	fd, skipped, err := trampoline.BuildRuleset(c.landlockSpec(), abi)
	if fd >= 0 {
		unix.Close(fd) //nolint:errcheck // only a check
	}
	return abi, skipped, err
}

func (c *Confinement) landlockSpec() LandlockSpec {
	return LandlockSpec{ReadOnly: c.ReadOnly, ReadWrite: c.ReadWrite, Hard: c.HardLandlock}
}

// LandlockScopes names the IPC scopes agent processes get on a kernel of
// Landlock ABI abi: "abstract_unix_socket" and "signal" from ABI 6.
func LandlockScopes(abi int) []string { return trampoline.ScopeNames(abi) }
