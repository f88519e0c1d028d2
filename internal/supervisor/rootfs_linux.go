package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/mountinfo"
)

// systemDirs are remounted read-only in process-driver sandboxes. Entries
// that are symlinks are resolved (usrmerge: /bin -> usr/bin is covered by
// /usr); entries that do not exist are skipped.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}

// sandboxWorkspace is where a rootfs sandbox sees its workspace.
const sandboxWorkspace = "/sandbox"

// gatewayDirInRootfs is where the gateway socket's directory is bound
// inside a rootfs (on the supervisor's own /dev tmpfs, so nothing is
// created in the image directory for it).
const gatewayDirInRootfs = "/dev/.openshell-gateway"

// mountFlags maps per-mount options to the MS_* flags a bind remount must
// repeat: in a user namespace the kernel locks nosuid, nodev, noexec and
// the atime mode of inherited mounts, and a remount that drops them fails
// with EPERM.
func mountFlags(options string) uintptr {
	var fl uintptr
	atime := false
	for o := range strings.SplitSeq(options, ",") {
		switch o {
		case "ro":
			fl |= unix.MS_RDONLY
		case "nosuid":
			fl |= unix.MS_NOSUID
		case "nodev":
			fl |= unix.MS_NODEV
		case "noexec":
			fl |= unix.MS_NOEXEC
		case "noatime":
			fl |= unix.MS_NOATIME
			atime = true
		case "relatime":
			fl |= unix.MS_RELATIME
			atime = true
		case "nodiratime":
			fl |= unix.MS_NODIRATIME
		case "nosymfollow":
			fl |= unix.MS_NOSYMFOLLOW
		}
	}
	if !atime {
		fl |= unix.MS_STRICTATIME
	}
	return fl
}

// under reports whether p is dir or inside it (both clean and absolute).
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// resolveDirs resolves dirs through symlinks (relative to the current
// root), keeps existing directories only and drops entries inside another
// kept entry. The result is sorted.
func resolveDirs(dirs []string, eval func(string) (string, error), isDir func(string) bool) []string {
	var real []string
	for _, d := range dirs {
		r, err := eval(d)
		if err != nil || !isDir(r) {
			continue
		}
		real = append(real, filepath.Clean(r))
	}
	slices.Sort(real)
	real = slices.Compact(real)
	var out []string
	for _, r := range real {
		covered := false
		for _, o := range out {
			if under(r, o) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, r)
		}
	}
	return out
}

func isDirPath(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// remountTargets returns the mount points to make read-only: every mount
// at or under one of dirs, except those at or under a keep path, each
// once, with the options of its last (topmost) entry.
func remountTargets(mounts []mountinfo.Mount, dirs, keep []string) []mountinfo.Mount {
	idx := map[string]int{}
	var out []mountinfo.Mount
	for _, m := range mounts {
		in := false
		for _, d := range dirs {
			if under(m.MountPoint, d) {
				in = true
				break
			}
		}
		for _, k := range keep {
			if under(m.MountPoint, k) {
				in = false
				break
			}
		}
		if !in {
			continue
		}
		if i, ok := idx[m.MountPoint]; ok {
			out[i] = m
			continue
		}
		idx[m.MountPoint] = len(out)
		out = append(out, m)
	}
	return out
}

// protectSystemDirs makes the system directories read-only in this mount
// namespace: a recursive bind of each onto itself, then a read-only bind
// remount of every mount under it. Paths in keep (the workspace) stay
// writable even when they lie inside a system directory.
func protectSystemDirs(keep []string) error {
	dirs := resolveDirs(systemDirs, filepath.EvalSymlinks, isDirPath)
	var keepReal []string
	for _, k := range keep {
		r, err := filepath.EvalSymlinks(k)
		if err != nil {
			return fmt.Errorf("read-only system directories: resolve %s: %w", k, err)
		}
		keepReal = append(keepReal, r)
		for _, d := range dirs {
			if under(r, d) {
				// Its own mount, carried along by the recursive bind below
				// and skipped by the read-only pass.
				if err := unix.Mount(r, r, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
					return fmt.Errorf("read-only system directories: bind %s onto itself: %w", r, err)
				}
				break
			}
		}
	}
	for _, d := range dirs {
		if err := unix.Mount(d, d, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("read-only system directories: bind %s onto itself: %w", d, err)
		}
	}
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read-only system directories: %w", err)
	}
	for _, m := range remountTargets(mounts, dirs, keepReal) {
		if err := remountReadOnly(m.MountPoint, m.Options); err != nil {
			return fmt.Errorf("read-only system directories: %w", err)
		}
	}
	return nil
}

func remountReadOnly(path, options string) error {
	fl := unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | mountFlags(options)
	if err := unix.Mount("", path, "", fl, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", path, err)
	}
	return nil
}

// mountProc mounts a fresh proc for the sandbox's pid namespace on target.
func mountProc(target string) error {
	return unix.Mount("proc", target, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// rootfsDir returns root/name, creating it as a directory when missing.
// An existing entry must be a real directory: a symlink in the image could
// otherwise point the mount at a host path.
func rootfsDir(root, name string) (string, error) {
	p := filepath.Join(root, name)
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("create %s: %w", p, err)
		}
		fi, err = os.Lstat(p)
	}
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s in the root filesystem is not a directory", p)
	}
	return p, nil
}

// stagingDir is where the sandbox's root is assembled before pivot_root.
// The host's /tmp is hidden from the sandbox anyway; every source under it
// (workspace, image, layer) is pinned by an fd or resolved before the
// staging mount covers it.
const stagingDir = "/tmp"

// enterSandboxRoot builds the sandbox's root filesystem and pivots into
// it: the image (cfg.Rootfs, under a per-sandbox writable layer) or a fresh
// tmpfs root holding read-only binds of the host's system directories; in
// both, the workspace at /sandbox, a fresh /proc, a minimal /dev and a
// private /tmp. Nothing else of the host is reachable afterwards: not the
// gateway's state directory, other sandboxes, /root, /home or host devices.
func enterSandboxRoot(cfg *Config) error {
	what := "sandbox root"
	if cfg.Rootfs != "" {
		what = "rootfs " + cfg.Rootfs
	}
	step := func(s string, err error) error { return fmt.Errorf("%s: %s: %w", what, s, err) }
	ws := cfg.WorkspaceDir
	if ws == "" {
		var err error
		if ws, err = os.Getwd(); err != nil {
			return step("workspace", err)
		}
	}
	// Pinned before the staging mount may cover the workspace's path. An
	// fd handed over by the driver (a detached mount) is used itself: it
	// is the only handle that can attach that mount. Either is closed at
	// the end, so no fd of the supervisor leads into the host filesystem.
	wsFD := inheritedFD(ws)
	if wsFD < 0 {
		var err error
		if wsFD, err = unix.Open(ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return step("open workspace "+ws, err)
		}
	}
	defer func() { _ = unix.Close(wsFD) }()
	// The gateway socket's directory, pinned by pinUnixEndpoint as an open
	// fd named in the endpoint; it is re-pointed after the pivot.
	gwFD, gwName := pinnedEndpoint(cfg.Endpoint)

	root := stagingDir
	if cfg.Rootfs != "" {
		if err := mountImage(cfg.Rootfs, cfg.RootfsLayer, root); err != nil {
			return step("mount image", err)
		}
	} else if err := mountHostSystem(root); err != nil {
		return step("host system directories", err)
	}
	if err := populateRoot(root, wsFD, gwFD); err != nil {
		return step("populate", err)
	}
	if cfg.beforePivot != nil {
		cfg.beforePivot()
	}
	if err := pivotInto(root); err != nil {
		return step("pivot", err)
	}
	if gwFD >= 0 {
		if err := repointGateway(gwFD, gwName); err != nil {
			return step("gateway socket", err)
		}
	}
	if cfg.Rootfs != "" {
		if err := protectSystemDirs([]string{sandboxWorkspace}); err != nil {
			return step("inside the image", err)
		}
	} else if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		// The tmpfs root itself: nothing may be added next to the binds.
		return step("remount / read-only", err)
	}
	if err := unix.Chdir(sandboxWorkspace); err != nil {
		return step("chdir "+sandboxWorkspace, err)
	}
	cfg.WorkspaceDir = sandboxWorkspace
	_ = os.Setenv(EnvWorkspaceDir, sandboxWorkspace) // children see the path inside the root
	_ = os.Setenv("PWD", sandboxWorkspace)
	return nil
}

// populateRoot mounts what every sandbox root holds: the workspace at
// /sandbox, a fresh proc, a minimal /dev, a private /tmp, the supervisor's
// /var/log (mountLogDir), and the gateway
// socket's directory (bound read-only on the /dev tmpfs, detached again
// after the pivot).
func populateRoot(root string, wsFD, gwFD int) error {
	dst, err := rootfsDir(root, sandboxWorkspace)
	if err != nil {
		return fmt.Errorf("workspace mount point: %w", err)
	}
	if err := bindFD(wsFD, dst, unix.MS_REC); err != nil {
		return fmt.Errorf("bind workspace at %s: %w", dst, err)
	}
	if dst, err = rootfsDir(root, "proc"); err != nil {
		return fmt.Errorf("proc mount point: %w", err)
	}
	if err := mountProc(dst); err != nil {
		// No fallback to the host's /proc: its /proc/<pid>/root links lead
		// out of the root filesystem.
		return fmt.Errorf("mount proc at %s: %w", dst, err)
	}
	if dst, err = rootfsDir(root, "dev"); err != nil {
		return fmt.Errorf("dev mount point: %w", err)
	}
	if err := mountDev(dst); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	if dst, err = rootfsDir(root, "tmp"); err != nil {
		return fmt.Errorf("tmp mount point: %w", err)
	}
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount private tmp at %s: %w", dst, err)
	}
	if err := mountLogDir(root); err != nil {
		return err
	}
	if gwFD >= 0 {
		dst = filepath.Join(root, gatewayDirInRootfs)
		if err := os.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("gateway socket mount point: %w", err)
		}
		if err := bindFD(gwFD, dst, 0); err != nil {
			return fmt.Errorf("bind gateway socket directory at %s: %w", dst, err)
		}
		// Connecting to a socket needs no write access to its mount.
		if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("remount gateway socket directory read-only: %w", err)
		}
	}
	return nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// bindFD mounts the directory open as fd at dst. A directory of this mount
// namespace is bound; a detached mount handed over by the process driver
// (open_tree in the gateway's namespace, which a bind refuses with EINVAL)
// is attached with move_mount.
func bindFD(fd int, dst string, flags uintptr) error {
	err := unix.Mount(fdPath(fd), dst, "", unix.MS_BIND|flags, "")
	if errors.Is(err, unix.EINVAL) {
		if merr := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); merr == nil {
			return nil
		}
	}
	return err
}

// pivotInto makes root the root directory. pivot_root(".", ".") stacks the
// old root on top of the new one; detaching it leaves the new root as /
// without a directory for the old root (so nothing is created in an image).
func pivotInto(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// repointGateway replaces the host directory fd gwFD by the bound copy, so
// no fd of the supervisor leads back into the host filesystem, then
// detaches the bind: the fd keeps the detached mount alive for connect(2),
// and the sandbox no longer sees the directory at all.
func repointGateway(gwFD int, gwName string) error {
	in, err := unix.Open(gatewayDirInRootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", gatewayDirInRootfs, err)
	}
	if err := unix.Dup3(in, gwFD, unix.O_CLOEXEC); err != nil {
		_ = unix.Close(in)
		return fmt.Errorf("re-point fd: %w", err)
	}
	_ = unix.Close(in)
	if err := unix.Unmount(gatewayDirInRootfs, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach %s: %w", gatewayDirInRootfs, err)
	}
	if err := os.Remove(gatewayDirInRootfs); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(fdPath(gwFD), gwName)); err != nil {
		return fmt.Errorf("after pivot: %w", err)
	}
	return nil
}

// pinnedEndpoint returns the fd and socket name of an endpoint rewritten
// by pinUnixEndpoint, or -1.
func pinnedEndpoint(endpoint string) (int, string) {
	rest, ok := strings.CutPrefix(endpoint, "unix:///proc/self/fd/")
	if !ok {
		return -1, ""
	}
	n, name, ok := strings.Cut(rest, "/")
	fd, err := strconv.Atoi(n)
	if !ok || err != nil || name == "" || strings.Contains(name, "/") {
		return -1, ""
	}
	return fd, name
}

// devNodes are bound from the host's /dev into a rootfs's /dev. Device
// nodes cannot be created in a user namespace, bind mounts of them can.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountDev builds a minimal /dev at dst: a tmpfs with the host's basic
// character devices bound in, a new devpts instance (ptmx -> pts/ptmx),
// /dev/shm and the usual fd symlinks.
func mountDev(dst string) error {
	// nodev applies to nodes created on the tmpfs, not to the bind mounts.
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", dst, err)
	}
	for _, n := range devNodes {
		src, p := "/dev/"+n, filepath.Join(dst, n)
		if _, err := os.Stat(src); err != nil {
			continue // e.g. no /dev/tty on the host
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		f.Close()
		if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", src, p, err)
		}
	}
	pts := filepath.Join(dst, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts at %s: %w", pts, err)
	}
	shm := filepath.Join(dst, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", shm, err)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}
