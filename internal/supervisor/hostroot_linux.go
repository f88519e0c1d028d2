package supervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/mountinfo"
)

// hostSystemDirs are bound read-only into a sandbox root assembled from
// the host (no image). Symlinks (usrmerge: /bin -> usr/bin) are recreated
// as symlinks; missing entries are skipped. /etc is bound too, filtered
// (see etcHidden).
var hostSystemDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"}

// etcHidden are paths under /etc covered by an empty file (or an empty
// directory) in a host-assembled root: password hashes, SSH host keys,
// TLS private keys and the gateway's own configuration.
var etcHidden = []string{
	"shadow", "shadow-", "gshadow", "gshadow-", "security/opasswd",
	"ssh/ssh_host_*_key", "ssl/private", "openshell",
}

// SandboxUser is the user a host-assembled root adds to its /etc/passwd
// and /etc/group (uid and gid 1000 unless the host uses them).
const SandboxUser = "sandbox"

// mountHostSystem mounts a tmpfs on root and fills it with read-only binds
// of the host's system directories, a filtered /etc whose passwd and group
// hold the sandbox user, and /var/tmp -> /tmp. Nothing of the host's /etc
// is written: the filters are bind mounts over the bound copy.
func mountHostSystem(root string) error {
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", root, err)
	}
	var bound []string
	for _, name := range hostSystemDirs {
		src := "/" + name
		fi, err := os.Lstat(src)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				return err
			}
			continue
		case !fi.IsDir():
			continue
		}
		dst := filepath.Join(root, name)
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", src, dst, err)
		}
		bound = append(bound, dst)
	}
	if err := filterEtc(root); err != nil {
		return fmt.Errorf("filter /etc: %w", err)
	}
	// Every bind and filter becomes read-only, repeating its locked flags;
	// root itself is remounted read-only after the pivot.
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, m := range remountTargets(mounts, bound, nil) {
		if err := remountReadOnly(m.MountPoint, m.Options); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		return err
	}
	return os.Symlink("/tmp", filepath.Join(root, "var", "tmp"))
}

// filterEtc covers etcHidden in root/etc and replaces passwd and group by
// copies that hold the sandbox user. The replacement files live on the
// root tmpfs only as long as it takes to bind them.
func filterEtc(root string) error {
	etc := filepath.Join(root, "etc")
	if _, err := os.Stat(etc); err != nil {
		return nil //nolint:nilerr // a host without /etc: nothing to filter
	}
	emptyFile := filepath.Join(root, ".empty-file")
	emptyDir := filepath.Join(root, ".empty-dir")
	if err := os.WriteFile(emptyFile, nil, 0o444); err != nil {
		return err
	}
	if err := os.Mkdir(emptyDir, 0o555); err != nil {
		return err
	}
	// The binds keep the inodes; the names go before / turns read-only.
	defer func() { _ = os.Remove(emptyFile); _ = os.Remove(emptyDir) }()
	for _, pattern := range etcHidden {
		matches, err := filepath.Glob(filepath.Join(etc, pattern))
		if err != nil {
			return err
		}
		for _, p := range matches {
			if err := overmount(p, emptyFile, emptyDir); err != nil {
				return err
			}
		}
	}
	passwd, errP := os.ReadFile(filepath.Join(etc, "passwd"))
	group, errG := os.ReadFile(filepath.Join(etc, "group"))
	if errP != nil || errG != nil {
		return nil //nolint:nilerr // no user database: nothing to add the user to
	}
	newPasswd, newGroup := withSandboxUser(passwd, group, shellFor(root))
	for name, data := range map[string][]byte{"passwd": newPasswd, "group": newGroup} {
		tmp := filepath.Join(root, "."+name)
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return err
		}
		err := overmount(filepath.Join(etc, name), tmp, "")
		_ = os.Remove(tmp) // the bind keeps the inode
		if err != nil {
			return err
		}
	}
	return nil
}

// overmount binds file (for a regular file) or dir (for a directory) over
// p. Anything else (a symlink, which a mount would follow out of the
// root) is left alone.
func overmount(p, file, dir string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	src := ""
	switch {
	case fi.Mode().IsRegular():
		src = file
	case fi.IsDir() && dir != "":
		src = dir
	default:
		return nil
	}
	if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("cover %s: %w", p, err)
	}
	return nil
}

func shellFor(root string) string {
	if _, err := os.Stat(filepath.Join(root, "bin", "bash")); err == nil {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// withSandboxUser returns passwd and group with a sandbox user and group
// added where missing. The new id is the smallest from 1000 used neither as
// a uid nor as a gid; an existing sandbox user keeps its entry.
func withSandboxUser(passwd, group []byte, shell string) ([]byte, []byte) {
	used := map[int]bool{}
	userGID := -1
	for _, f := range dbEntries(passwd) {
		if len(f) >= 4 {
			if id, err := strconv.Atoi(f[2]); err == nil {
				used[id] = true
			}
			if f[0] == SandboxUser {
				userGID, _ = strconv.Atoi(f[3])
			}
		}
	}
	hasGroup := false
	for _, f := range dbEntries(group) {
		if len(f) >= 3 {
			if id, err := strconv.Atoi(f[2]); err == nil {
				used[id] = true
			}
			hasGroup = hasGroup || f[0] == SandboxUser
		}
	}
	id := 1000
	for used[id] {
		id++
	}
	if userGID < 0 {
		passwd = appendLine(passwd, fmt.Sprintf("%s:x:%d:%d:OpenShell sandbox:%s:%s", SandboxUser, id, id, sandboxWorkspace, shell))
		userGID = id
	}
	if !hasGroup {
		group = appendLine(group, fmt.Sprintf("%s:x:%d:", SandboxUser, userGID))
	}
	return passwd, group
}

// dbEntries splits a passwd or group file into colon-separated fields.
func dbEntries(data []byte) [][]string {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}

func appendLine(data []byte, line string) []byte {
	out := bytes.Clone(data)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...)
}
