//go:build linux

package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// prepareImage passes a dir: image sandbox's writable layer (owned by the
// sandbox's root, host id base) as a detached mount, and a socket on which
// the supervisor receives the image itself: an id-mapped mount can only
// be made once the supervisor's user namespace exists, so sendImageMount
// sends it after the start. It returns the gateway's end of that socket.
func (d *Driver) prepareImage(sb *sandbox, in *inherited, base uint32) (*os.File, error) {
	id := sb.rec.ID
	layer := d.layerDir(id)
	if err := os.MkdirAll(layer, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox %q: writable layer: %w", id, err)
	}
	if err := shiftLayer(layer, base); err != nil {
		return nil, fmt.Errorf("sandbox %q: writable layer owner: %w", id, err)
	}
	lt, err := openTree(layer)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, err)
	}
	setEnv(in.cmd, "OPENSHELL_ROOTFS_LAYER", in.pass(lt))
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: image socket: %w", id, err)
	}
	setEnv(in.cmd, "OPENSHELL_ROOTFS", in.pass(os.NewFile(uintptr(fds[1]), "image-mount")))
	return os.NewFile(uintptr(fds[0]), "image-mount"), nil
}

// sendImageMount gives the supervisor pid its image: a detached copy of
// the image directory's mount, read-only, id-mapped into pid's user
// namespace (a file the image's root owns is the sandbox's root's, a file
// of uid 1000 the sandbox's uid 1000, and so on for ids 0..65535; on the
// host they stay the ids the image has on disk). The supervisor uses it as
// the overlay's lower layer. A kernel or filesystem without id-mapped
// mounts is an error: the driver never runs an image sandbox as host root
// instead.
func sendImageMount(sock *os.File, pid int, image string) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return fmt.Errorf("supervisor user namespace: %w", err)
	}
	defer ns.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, image, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("dir: image %s: open_tree: %w", image, err)
	}
	defer unix.Close(fd) //nolint:errcheck // sent, or the spawn failed
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID,
		Userns_fd: uint64(ns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		var uts unix.Utsname
		_ = unix.Uname(&uts)
		return fmt.Errorf("dir: image %s cannot be id-mapped into the sandbox's user namespace "+
			"(kernel %s; needs id-mapped mounts, Linux 5.12 or later, on a filesystem that supports them; "+
			"the process driver does not run image sandboxes as host root instead): mount_setattr: %w",
			image, unix.ByteSliceToString(uts.Release[:]), err)
	}
	if err := unix.Sendmsg(int(sock.Fd()), []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("send the image mount to the supervisor: %w", err)
	}
	return nil
}

// shiftLayer makes layer (a dir: image's writable layer) the sandbox's:
// owned by host id base, the sandbox's root. A layer written by a
// supervisor without a user namespace (earlier versions ran image
// sandboxes as host root) is converted once: owners u < 65536 become
// base+u, so each file keeps its owner as the sandbox sees it, and the
// overlay's trusted.overlay.* attributes (whiteouts, opaque directories)
// become the user.overlay.* ones an overlay in a user namespace reads.
func shiftLayer(layer string, base uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(layer, &st); err != nil {
		return err
	}
	if st.Uid == base && st.Gid == base {
		return nil
	}
	return filepath.WalkDir(layer, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, gid := st.Uid, st.Gid
		if uid < idRangeSize {
			uid += base
		}
		if gid < idRangeSize {
			gid += base
		}
		if err := os.Lchown(p, int(uid), int(gid)); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG, unix.S_IFDIR:
			// chown clears the setuid and setgid bits. Overlay keeps its
			// attributes on these only (user.* ones fit nothing else).
			if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
				return err
			}
			return userOverlayXattrs(p)
		}
		return nil
	})
}

// userOverlayXattrs renames p's trusted.overlay.* attributes to
// user.overlay.*.
func userOverlayXattrs(p string) error {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", p, err)
	}
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		rest, ok := strings.CutPrefix(name, "trusted.overlay.")
		if !ok {
			continue
		}
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			return fmt.Errorf("read %s of %s: %w", name, p, err)
		}
		if err := unix.Lsetxattr(p, "user.overlay."+rest, val[:m], 0); err != nil {
			return fmt.Errorf("write user.overlay.%s of %s: %w", rest, p, err)
		}
		if err := unix.Lremovexattr(p, name); err != nil {
			return fmt.Errorf("remove %s of %s: %w", name, p, err)
		}
	}
	return nil
}
