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
func mountImage(image, layer, root string) error {
	img, err := filepath.EvalSymlinks(image)
	if err != nil {
		return err
	}
	if !isDirPath(img) || img == "/" {
		return errors.New("not a directory other than /")
	}
	if layer == "" {
		return fmt.Errorf("no writable layer directory (%s)", EnvRootfsLayer)
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
