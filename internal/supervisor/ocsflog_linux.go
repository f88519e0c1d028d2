package supervisor

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// logDirSize bounds the tmpfs of a sandbox's /var/log (memory). When it
// is full, further OCSF lines are dropped (the write fails).
const logDirSize = "64m"

// mountLogDir mounts a fresh tmpfs at root/var/log for the supervisor's
// log files: owned by the supervisor's user, mode 0755, so the agent
// (another uid, without capabilities) can read them but not create,
// change, truncate, rename or remove any. An image's own /var/log is
// hidden under it.
func mountLogDir(root string) error {
	if _, err := rootfsDir(root, "var"); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	dst, err := rootfsDir(root, filepath.Join("var", "log"))
	if err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size="+logDirSize); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", dst, err)
	}
	return nil
}
