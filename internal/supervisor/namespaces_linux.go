package supervisor

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

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

// pinUnixEndpoint keeps a unix:// gateway socket reachable after a private
// /tmp hides its directory: it opens the directory now and rewrites the
// endpoint to go through /proc/self/fd. The returned file must stay open.
func pinUnixEndpoint(cfg *Config) (*os.File, error) {
	if !cfg.PrivateTmp || !strings.HasPrefix(cfg.Endpoint, "unix://") {
		return nil, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || u.Path == "" {
		return nil, fmt.Errorf("%s: invalid unix endpoint", EnvEndpoint)
	}
	dir, err := os.OpenFile(filepath.Dir(u.Path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open gateway socket directory: %w", err)
	}
	cfg.Endpoint = fmt.Sprintf("unix:///proc/self/fd/%d/%s", dir.Fd(), filepath.Base(u.Path))
	return dir, nil
}
