package isolation

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CheckIdentity reports whether this process can switch to c's user: the
// uid and gid must be mapped in its user namespace, and setgroups must be
// allowed there (a namespace that maps only the supervisor's own id, as an
// unprivileged gateway creates, cannot hold an unprivileged agent).
func (c *Confinement) CheckIdentity() error {
	for _, m := range []struct {
		file, what string
		id         uint32
	}{
		{"/proc/self/uid_map", "uid", c.User.UID},
		{"/proc/self/gid_map", "gid", c.User.GID},
	} {
		b, err := os.ReadFile(m.file)
		if err != nil {
			return fmt.Errorf("read %s: %w", m.file, err)
		}
		if !idMapped(string(b), m.id) {
			return fmt.Errorf("the agent's %s %d is not mapped in the supervisor's user namespace", m.what, m.id)
		}
	}
	if b, err := os.ReadFile("/proc/self/setgroups"); err == nil && strings.TrimSpace(string(b)) == "deny" {
		return errors.New("setgroups is denied in the supervisor's user namespace: the agent's supplementary groups cannot be cleared")
	}
	return nil
}

// idMapped reports whether id is inside one of the ranges of a
// /proc/<pid>/[ug]id_map file.
func idMapped(idMap string, id uint32) bool {
	for _, line := range strings.Split(idMap, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		inside, err1 := strconv.ParseUint(f[0], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 == nil && err2 == nil && uint64(id) >= inside && uint64(id) < inside+n {
			return true
		}
	}
	return false
}
