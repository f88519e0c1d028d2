package isolation

import (
	"golang.org/x/sys/unix"
)

// CheckLandlock reports what the domain thread will do with c's Landlock
// rules: the kernel's ABI and the paths it will skip. Under hard_requirement a problem is an error.
func (c *Confinement) CheckLandlock() (abi int, skipped []PathProblem, err error) {
	abi = LandlockABI()
	fd, skipped, err := buildRuleset(c.landlockSpec(), abi)
	if fd >= 0 {
		unix.Close(fd) //nolint:errcheck // only a check
	}
	return abi, skipped, err
}

func (c *Confinement) landlockSpec() LandlockSpec {
	return LandlockSpec{ReadOnly: c.ReadOnly, ReadWrite: c.ReadWrite, Hard: c.HardLandlock}
}
