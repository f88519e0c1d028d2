package supervisor

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// setupNamespaces applies the process driver's start contract. It runs
// before anything else, in the new mount and uts namespaces the driver
// created, and before the first connection to the gateway.
//
// With OPENSHELL_PRIVATE_TMP or OPENSHELL_ROOTFS it builds the sandbox's
// own root filesystem and pivots into it (see enterSandboxRoot): the image
// under a per-sandbox writable layer, or, without an image, read-only
// binds of the host's system directories on a fresh tmpfs; the workspace
// at /sandbox (cfg.WorkspaceDir points there afterwards). Every failure
// names the step and path; the supervisor then exits non-zero.
func setupNamespaces(cfg *Config) error {
	if cfg.PrivateTmp || cfg.Rootfs != "" {
		// Keep our mounts from propagating back to the host first.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private (needs a new mount namespace): %w", err)
		}
		if err := enterSandboxRoot(cfg); err != nil {
			return err
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname (needs a new uts namespace): %w", err)
		}
	}
	if cfg.PrivateNetwork {
		if err := setupLoopbackOnly(); err != nil {
			return err
		}
	}
	return nil
}

// setupLoopbackOnly brings up lo in the supervisor's network namespace and
// checks that it is the only interface there: a namespace with any other
// (the host's, or one a driver left a link in) would give the sandbox a
// way out, so the supervisor refuses to start instead. The gateway stays
// reachable through its unix socket, which no network namespace confines.
func setupLoopbackOnly() error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("list network interfaces: %w", err)
	}
	var others []string
	for _, ifc := range ifaces {
		if ifc.Name != "lo" {
			others = append(others, ifc.Name)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("%s: the supervisor is not in a network namespace of its own (interfaces besides lo: %s)", EnvPrivateNetwork, strings.Join(others, ", "))
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	defer unix.Close(fd) //nolint:errcheck // a probe socket
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("read lo flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil // already up (a Docker container of network mode none): no CAP_NET_ADMIN needed
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo (needs CAP_NET_ADMIN in the network namespace): %w", err)
	}
	return nil
}

// pinUnixEndpoint keeps a unix:// gateway socket reachable after a private
// /tmp hides its directory or a pivot_root leaves the host filesystem: it
// opens the directory now and rewrites the endpoint to go through
// /proc/self/fd. The returned file must stay open. enterSandboxRoot
// replaces that fd by a detached bind of the directory.
func pinUnixEndpoint(cfg *Config) (*os.File, error) {
	if (!cfg.PrivateTmp && cfg.Rootfs == "") || !strings.HasPrefix(cfg.Endpoint, "unix://") {
		return nil, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || u.Path == "" {
		return nil, fmt.Errorf("%s: invalid unix endpoint", EnvEndpoint)
	}
	if fd := inheritedFD(filepath.Dir(u.Path)); fd >= 0 {
		// Handed over by the process driver (a detached mount, which only
		// this fd can attach): kept as it is.
		return os.NewFile(uintptr(fd), filepath.Dir(u.Path)), nil
	}
	dir, err := os.OpenFile(filepath.Dir(u.Path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open gateway socket directory: %w", err)
	}
	cfg.Endpoint = fmt.Sprintf("unix:///proc/self/fd/%d/%s", dir.Fd(), filepath.Base(u.Path))
	return dir, nil
}

// inheritedFD returns N for a path /proc/self/fd/N, the form in which the
// process driver hands over files the supervisor cannot reach by path (it
// runs with the sandbox's host ids), or -1.
func inheritedFD(p string) int {
	rest, ok := strings.CutPrefix(p, "/proc/self/fd/")
	if !ok {
		return -1
	}
	fd, err := strconv.Atoi(rest)
	if err != nil || fd < 3 {
		return -1
	}
	return fd
}

// sealInheritedFDs marks every inherited fd close-on-exec, so none reaches
// a sandbox process, and closes the one the supervisor was executed
// through (the process driver runs it as /proc/self/fd/N).
func sealInheritedFDs() {
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	var exe unix.Stat_t
	if unix.Stat("/proc/self/exe", &exe) != nil {
		return
	}
	for fd := 3; fd < 64; fd++ {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Dev == exe.Dev && st.Ino == exe.Ino {
			_ = unix.Close(fd)
		}
	}
}
