package supervisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mountImage mounts the image directory at root under the sandbox's own
// writable layer in layer: an overlay (lower: the image, read-only; upper
// and work: layer/upper, layer/work), or, where the kernel refuses the
// overlay, a private copy of the image in layer/copy. Either way writes
// stay in layer, never in the image, and the layer outlives stop/start.
//
// image and layer are paths, or /proc/self/fd/N: the process driver hands
// the layer over as a detached mount and the image as a socket on which it
// sends a detached, id-mapped mount of the image once this process's user
// namespace exists (a detached mount itself is taken too). Those are
// attached on a staging tmpfs at root, which the image then covers; they
// leave with the old root at the pivot.
func mountImage(image, layer, root string) error {
	if layer == "" {
		return fmt.Errorf("no writable layer directory (%s)", EnvRootfsLayer)
	}
	imgFD, layerFD := inheritedFD(image), inheritedFD(layer)
	if imgFD >= 0 || layerFD >= 0 {
		if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"); err != nil {
			return fmt.Errorf("mount staging tmpfs at %s: %w", root, err)
		}
	}
	img := filepath.Join(root, ".image")
	if imgFD >= 0 {
		if err := attachImage(imgFD, img); err != nil {
			return err
		}
	} else {
		var err error
		if img, err = filepath.EvalSymlinks(image); err != nil {
			return err
		}
		if !isDirPath(img) || img == "/" {
			return errors.New("not a directory other than /")
		}
	}
	if layerFD >= 0 {
		l := filepath.Join(root, ".layer")
		if err := os.Mkdir(l, 0o700); err != nil {
			return err
		}
		err := bindFD(layerFD, l, 0)
		_ = unix.Close(layerFD) // attached: no fd of the host's layer directory stays open
		if err != nil {
			return fmt.Errorf("attach writable layer at %s: %w", l, err)
		}
		layer = l
	}
	src, err := imageLayer(img, layer, mountOverlay(root))
	if err != nil {
		return err
	}
	if src == "" {
		return nil // overlay mounted
	}
	if err := unix.Mount(src, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind image copy %s at %s: %w", src, root, err)
	}
	return nil
}

// attachImage attaches the image mount named by fd (a detached mount, or a
// socket that carries one) at dst, and closes fd.
func attachImage(fd int, dst string) error {
	defer func() { _ = unix.Close(fd) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("image fd %d: %w", fd, err)
	}
	mnt := fd
	if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		var err error
		if mnt, err = receiveFD(fd); err != nil {
			return fmt.Errorf("receive the image mount: %w", err)
		}
		defer func() { _ = unix.Close(mnt) }()
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the image mount at %s: %w", dst, err)
	}
	return nil
}

// receiveFD waits for one message carrying one fd on the socket sock.
func receiveFD(sock int) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		_, oobn, _, _, err := unix.Recvmsg(sock, make([]byte, 1), oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return -1, err
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return -1, err
		}
		var fds []int
		for i := range msgs {
			got, err := unix.ParseUnixRights(&msgs[i])
			if err == nil {
				fds = append(fds, got...)
			}
		}
		if len(fds) != 1 {
			for _, f := range fds {
				_ = unix.Close(f)
			}
			return -1, fmt.Errorf("got %d fds, want 1 (the process driver closed the socket without sending the image)", len(fds))
		}
		return fds[0], nil
	}
}

// mountOverlay returns the overlay mount of lower, upper and work at
// target. The layers are named through fds: paths with commas or colons
// would need escaping in the mount options.
func mountOverlay(target string) func(lower, upper, work string) error {
	return func(lower, upper, work string) error {
		var fds []int
		defer func() {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}()
		var paths []string
		for _, p := range []string{lower, upper, work} {
			fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			paths = append(paths, fdPath(fd))
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", paths[0], paths[1], paths[2])
		err := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
			// Inside a user namespace the overlay keeps its metadata in
			// user.* extended attributes.
			if err2 := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts+",userxattr"); err2 == nil {
				return nil
			}
		}
		return err
	}
}

// imageLayer prepares the writable layer of img in layer. It returns ""
// after overlay mounted the image, or the directory holding a private copy
// of the image when overlay is unavailable (also on later starts, so the
// writes of earlier runs stay visible).
func imageLayer(img, layer string, overlay func(lower, upper, work string) error) (string, error) {
	if err := os.MkdirAll(layer, 0o700); err != nil {
		return "", err
	}
	cp := filepath.Join(layer, "copy")
	if isDirPath(cp) {
		return cp, nil
	}
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	// The root of the merged tree takes its mode and owner from upper.
	if err := copyAttrs(img, upper); err != nil {
		return "", err
	}
	oerr := overlay(img, upper, work)
	if oerr == nil {
		return "", nil
	}
	tmp := cp + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := copyTree(img, tmp); err != nil {
		return "", fmt.Errorf("overlay: %w; copy of the image: %w", oerr, err)
	}
	if err := os.Rename(tmp, cp); err != nil {
		return "", err
	}
	_ = os.RemoveAll(upper)
	_ = os.RemoveAll(work)
	return cp, nil
}

// copyAttrs gives dst the permission bits and (where this process may)
// the owner of src.
func copyAttrs(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		// Unmapped owners (a user namespace) cannot be set; the copy then
		// belongs to the supervisor.
		_ = os.Lchown(dst, int(st.Uid), int(st.Gid))
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil
	}
	return os.Chmod(dst, fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
}

// copyTree copies the directories, regular files and symlinks of src to
// dst (which must not exist), keeping modes and, where possible, owners.
// Device nodes, sockets and fifos are skipped: the sandbox gets its own
// /dev.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch t := d.Type(); {
		case t.IsDir():
			if err := os.Mkdir(to, 0o700); err != nil {
				return err
			}
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case t.IsRegular():
			if err := copyFile(p, to); err != nil {
				return err
			}
		default:
			return nil
		}
		return copyAttrs(p, to)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
