//go:build linux

package sftpd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
)

// client serves root over an in-memory pipe and returns a client of it.
func client(t *testing.T, root string) *sftp.Client {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(a, root) }()
	c, err := sftp.NewClientPipe(b, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = b.Close()
		<-done
	})
	return c
}

func wantOutside(t *testing.T, what string, err error) {
	t.Helper()
	var se *sftp.StatusError
	if !errors.As(err, &se) || !strings.Contains(se.Error(), ErrOutside.Error()) {
		t.Errorf("%s = %v, want %q", what, err, ErrOutside)
	}
}

// TestConfinedToRoot: reads and writes inside the root work, with modes
// and times; ".." and symbolic links out of the root are refused by the
// kernel, for every operation, and nothing outside is touched.
func TestConfinedToRoot(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "ws")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("inner", filepath.Join(root, "inside-link")); err != nil {
		t.Fatal(err)
	}
	c := client(t, root)

	// Inside: create, write, chmod, chtimes, read back, rename, list.
	if err := c.Mkdir(root + "/inner"); err != nil {
		t.Fatal(err)
	}
	f, err := c.OpenFile("inner/a.txt", os.O_WRONLY|os.O_CREATE|os.O_TRUNC) // relative to the root
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, "hello"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	mt := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := c.Chmod(root+"/inner/a.txt", 0o640); err != nil {
		t.Fatal(err)
	}
	if err := c.Chtimes(root+"/inner/a.txt", mt, mt); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "inner", "a.txt"))
	if err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mt) || fi.Size() != 5 {
		t.Fatalf("written file = %v, %v; want 5 bytes, 0640, %v", fi, err, mt)
	}
	if err := c.Rename(root+"/inner/a.txt", root+"/inside-link/b.txt"); err != nil {
		t.Fatalf("rename through a symlink inside the root: %v", err)
	}
	if list, err := c.ReadDir(root + "/inner"); err != nil || len(list) != 1 || list[0].Name() != "b.txt" {
		t.Fatalf("ReadDir(inner) = %v, %v; want b.txt", list, err)
	}

	// Escapes.
	_, err = c.Open(root + "/escape/secret")
	wantOutside(t, "read through a symlink out", err)
	_, err = c.Open(root + "/../outside/secret")
	wantOutside(t, "read ../", err)
	_, err = c.OpenFile(root+"/escape/new", os.O_WRONLY|os.O_CREATE)
	wantOutside(t, "create through a symlink out", err)
	wantOutside(t, "mkdir through a symlink out", c.Mkdir(root+"/escape/d"))
	wantOutside(t, "remove through a symlink out", c.Remove(root+"/escape/secret"))
	wantOutside(t, "rename out", c.Rename(root+"/inner/b.txt", root+"/escape/b.txt"))
	wantOutside(t, "stat through a symlink out", func() error { _, err := c.Stat(root + "/escape/secret"); return err }())
	if err := c.Chmod(root+"/escape", 0o777); err == nil {
		t.Error("chmod of a symlink leading out succeeded, want refused")
	}
	_, err = c.ReadDir(root + "/escape")
	wantOutside(t, "list through a symlink out", err)
	if _, err := c.Open("/etc/passwd"); err == nil {
		t.Error("open /etc/passwd succeeded, want refused")
	}

	// Nothing outside changed.
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 || entries[0].Name() != "secret" {
		t.Errorf("outside = %v, want only secret", entries)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("outside dir mode = %v, %v; want 0755", fi, err)
	}
}

// TestChown: ownership may change only to the server's own uid and to one
// of its groups; anything else is refused as permission denied, with the
// ids named, before the kernel is asked (the test may run as root, which
// the kernel would let through).
func TestChown(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	c := client(t, root)
	uid, gid := os.Getuid(), os.Getgid()
	if err := c.Chown("f", uid, gid); err != nil {
		t.Fatalf("chown to the own uid %d and gid %d = %v, want done", uid, gid, err)
	}
	other := 54321
	groups, _ := os.Getgroups()
	for slices.Contains(groups, other) || other == gid {
		other++
	}
	for _, tc := range []struct {
		name     string
		uid, gid int
		want     string
	}{
		{"another owner", uid + 1, gid, fmt.Sprintf("chown to uid %d refused", uid+1)},
		{"a foreign group", uid, other, fmt.Sprintf("chgrp to gid %d refused", other)},
	} {
		// The client turns the status into os.ErrPermission; the
		// status message (for clients that show it) is ownerAllowed's.
		if err := c.Chown("f", tc.uid, tc.gid); !errors.Is(err, os.ErrPermission) {
			t.Errorf("%s: Chown = %v, want permission denied", tc.name, err)
		}
		if err := ownerAllowed(uint32(tc.uid), uint32(tc.gid)); !errors.Is(err, sftp.ErrSSHFxPermissionDenied) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ownerAllowed = %v, want permission denied %q", tc.name, err, tc.want)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("after refusals f is owned by %d:%d, want %d:%d", st.Uid, st.Gid, uid, gid)
	}
	if err := c.Chown("out", uid, gid); err == nil {
		t.Error("chown of a symlink leading out succeeded, want refused")
	}
}
