package supervisor

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// setupNamespaces applies the process driver's start contract. It runs
// before anything else, in the new mount and uts namespaces the driver
// created.
func setupNamespaces(cfg Config) error {
	if cfg.Rootfs != "" {
		return errors.New("OPENSHELL_ROOTFS is set but pivot_root into a root filesystem is not supported by this supervisor")
	}
	if cfg.PrivateTmp {
		// Keep our mounts from propagating back to the host first.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private (needs a new mount namespace): %w", err)
		}
		if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mount private /tmp: %w", err)
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname (needs a new uts namespace): %w", err)
		}
	}
	return nil
}
