//go:build linux

// Package sftpd is the SFTP server of the supervisor's SSH "sftp"
// subsystem. The supervisor runs it as an agent process
// ("openshell-sandbox sftp-server ROOT", started through the same
// confinement as every agent process: the agent's user, Landlock, seccomp),
// speaking SFTP on stdin/stdout.
//
// Every path is resolved beneath ROOT (the sandbox's workspace) by the
// kernel: files are opened with openat2(RESOLVE_BENEATH), so ".." and
// symbolic links that lead outside ROOT fail, reads and writes alike, with
// "path escapes the sandbox workspace". Changes (mkdir, rename, remove,
// chmod, times) act on the final name inside its beneath-resolved parent
// directory and never follow a final symbolic link.
//
// Ownership changes (chown, chgrp) are limited to what the agent's user
// may give away, checked before the kernel is asked: the owner must stay
// the server's own uid and the group must be one of its groups. Anything
// else is refused with "permission denied" and a message naming the ids.
package sftpd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/sys/unix"
)

// ErrOutside is the refusal of a path outside the workspace.
var ErrOutside = errors.New("path escapes the sandbox workspace")

// Serve answers SFTP requests on rw until the client ends the session,
// with every path confined to root.
func Serve(rw io.ReadWriteCloser, root string) error {
	root = path.Clean(root)
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	fs := &fsys{root: root, rootFD: fd}
	defer func() { _ = unix.Close(fd) }()
	h := sftp.Handlers{FileGet: fs, FilePut: fs, FileCmd: fs, FileList: fs}
	srv := sftp.NewRequestServer(rw, h, sftp.WithStartDirectory(root))
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

type fsys struct {
	root   string
	rootFD int
}

var (
	_ sftp.FileReader      = (*fsys)(nil)
	_ sftp.FileWriter      = (*fsys)(nil)
	_ sftp.FileCmder       = (*fsys)(nil)
	_ sftp.LstatFileLister = (*fsys)(nil)
)

// rel returns p relative to the root ("." for the root itself).
func (f *fsys) rel(p string) (string, error) {
	p = path.Clean("/" + p)
	if p == f.root {
		return ".", nil
	}
	if f.root == "/" {
		return strings.TrimPrefix(p, "/"), nil
	}
	r, ok := strings.CutPrefix(p, f.root+"/")
	if !ok {
		return "", ErrOutside
	}
	return r, nil
}

func mapErr(err error) error {
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
		return ErrOutside
	}
	return err
}

// open opens rel beneath the root.
func (f *fsys) open(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := unix.Openat2(f.rootFD, rel, &unix.OpenHow{
		Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: mapErr(err)}
	}
	return os.NewFile(uintptr(fd), path.Base(rel)), nil
}

// parent opens the directory holding p and returns it with p's last name.
func (f *fsys) parent(p string) (*os.File, string, error) {
	rel, err := f.rel(p)
	if err != nil {
		return nil, "", err
	}
	if rel == "." {
		return nil, "", errors.New("the workspace root itself cannot be changed")
	}
	d, err := f.open(path.Dir(rel), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", err
	}
	return d, path.Base(rel), nil
}

func (f *fsys) openPath(p string, flags int, mode uint32) (*os.File, error) {
	rel, err := f.rel(p)
	if err != nil {
		return nil, err
	}
	return f.open(rel, flags, mode)
}

// Fileread implements sftp.FileReader.
func (f *fsys) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	return f.openPath(r.Filepath, unix.O_RDONLY, 0)
}

// Filewrite implements sftp.FileWriter.
func (f *fsys) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	pf := r.Pflags()
	flags := unix.O_WRONLY
	if pf.Read {
		flags = unix.O_RDWR
	}
	if pf.Creat {
		flags |= unix.O_CREAT
	}
	if pf.Trunc {
		flags |= unix.O_TRUNC
	}
	if pf.Excl {
		flags |= unix.O_EXCL
	}
	mode := uint32(0o644)
	if r.AttrFlags().Permissions {
		mode = uint32(r.Attributes().FileMode().Perm())
	}
	return f.openPath(r.Filepath, flags, mode)
}

// Filecmd implements sftp.FileCmder.
func (f *fsys) Filecmd(r *sftp.Request) error {
	switch r.Method {
	case "Setstat":
		return f.setstat(r)
	case "Rename":
		return f.rename(r.Filepath, r.Target)
	case "Rmdir", "Remove", "Mkdir":
		d, name, err := f.parent(r.Filepath)
		if err != nil {
			return err
		}
		defer d.Close()
		switch r.Method {
		case "Rmdir":
			err = unix.Unlinkat(int(d.Fd()), name, unix.AT_REMOVEDIR)
		case "Remove":
			err = unix.Unlinkat(int(d.Fd()), name, 0)
		default:
			err = unix.Mkdirat(int(d.Fd()), name, 0o755)
		}
		return pathErr(r.Method, r.Filepath, err)
	case "Symlink":
		// The link is made inside the workspace; whatever it names is
		// resolved beneath the root on every later access.
		d, name, err := f.parent(r.Filepath)
		if err != nil {
			return err
		}
		defer d.Close()
		return pathErr("symlink", r.Filepath, unix.Symlinkat(r.Target, int(d.Fd()), name))
	}
	return sftp.ErrSSHFxOpUnsupported
}

func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: p, Err: mapErr(err)}
}

func (f *fsys) rename(from, to string) error {
	od, oname, err := f.parent(from)
	if err != nil {
		return err
	}
	defer od.Close()
	nd, nname, err := f.parent(to)
	if err != nil {
		return err
	}
	defer nd.Close()
	return pathErr("rename", from, unix.Renameat(int(od.Fd()), oname, int(nd.Fd()), nname))
}

// ownerAllowed refuses an ownership change the server's user may not
// make: another owner, or a group it is not a member of.
func ownerAllowed(uid, gid uint32) error {
	if int(uid) != os.Getuid() {
		return fmt.Errorf("chown to uid %d refused: files in the sandbox belong to the agent user (uid %d): %w", uid, os.Getuid(), sftp.ErrSSHFxPermissionDenied)
	}
	if int(gid) == os.Getgid() {
		return nil
	}
	groups, err := os.Getgroups()
	if err != nil {
		return err
	}
	for _, g := range groups {
		if g == int(gid) {
			return nil
		}
	}
	return fmt.Errorf("chgrp to gid %d refused: the agent user (uid %d) is not a member of it: %w", gid, os.Getuid(), sftp.ErrSSHFxPermissionDenied)
}

// setstat applies ownership, size, permissions and times to a file or
// directory; a final symbolic link is refused rather than followed.
func (f *fsys) setstat(r *sftp.Request) error {
	flags, attrs := r.AttrFlags(), r.Attributes()
	if flags.UidGid {
		if err := ownerAllowed(attrs.UID, attrs.GID); err != nil {
			return err
		}
	}
	p, err := f.openPath(r.Filepath, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer p.Close()
	fi, err := p.Stat()
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return pathErr("setstat", r.Filepath, unix.ELOOP)
	}
	procPath := "/proc/self/fd/" + itoa(int(p.Fd()))
	if flags.UidGid {
		// The kernel still decides: the file must be the agent's own.
		if err := unix.Fchownat(int(p.Fd()), "", int(attrs.UID), int(attrs.GID), unix.AT_EMPTY_PATH); err != nil {
			return pathErr("chown", r.Filepath, err)
		}
	}
	if flags.Size {
		w, err := f.openPath(r.Filepath, unix.O_WRONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		err = w.Truncate(int64(attrs.Size))
		w.Close()
		if err != nil {
			return err
		}
	}
	if flags.Permissions {
		if err := unix.Fchmodat(unix.AT_FDCWD, procPath, uint32(attrs.FileMode().Perm()), 0); err != nil {
			return pathErr("chmod", r.Filepath, err)
		}
	}
	if flags.Acmodtime {
		ts := []unix.Timespec{unix.NsecToTimespec(time.Unix(int64(attrs.Atime), 0).UnixNano()), unix.NsecToTimespec(time.Unix(int64(attrs.Mtime), 0).UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath, ts, 0); err != nil {
			return pathErr("utimes", r.Filepath, err)
		}
	}
	return nil
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// Filelist implements sftp.FileLister (List, Stat, Readlink).
func (f *fsys) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	switch r.Method {
	case "List":
		d, err := f.openPath(r.Filepath, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		infos, err := d.Readdir(-1)
		if err != nil {
			return nil, err
		}
		return lister(infos), nil
	case "Stat":
		return f.stat(r.Filepath, 0)
	case "Readlink":
		d, name, err := f.parent(r.Filepath)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(int(d.Fd()), name, buf)
		if err != nil {
			return nil, pathErr("readlink", r.Filepath, err)
		}
		return lister{linkInfo(string(buf[:n]))}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// Lstat implements sftp.LstatFileLister.
func (f *fsys) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	return f.stat(r.Filepath, unix.O_NOFOLLOW)
}

func (f *fsys) stat(p string, extra int) (sftp.ListerAt, error) {
	h, err := f.openPath(p, unix.O_PATH|extra, 0)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	fi, err := h.Stat()
	if err != nil {
		return nil, err
	}
	return lister{fi}, nil
}

type lister []os.FileInfo

func (l lister) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if off+int64(n) >= int64(len(l)) {
		return n, io.EOF
	}
	return n, nil
}

// linkInfo carries a symbolic link's target as the name Readlink returns.
type linkInfo string

func (l linkInfo) Name() string       { return string(l) }
func (l linkInfo) Size() int64        { return 0 }
func (l linkInfo) Mode() os.FileMode  { return os.ModeSymlink | 0o777 }
func (l linkInfo) ModTime() time.Time { return time.Time{} }
func (l linkInfo) IsDir() bool        { return false }
func (l linkInfo) Sys() any           { return nil }
