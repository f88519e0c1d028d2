package supervisor

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	in := `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
28 27 0:25 / /mnt/with\040space ro,nosuid,nodev,relatime shared:1 - tmpfs x ro
`
	got, err := parseMountinfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []mountEntry{
		{"/proc", "rw,relatime"},
		{"/", "rw,relatime"},
		{"/mnt/with space", "ro,nosuid,nodev,relatime"},
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(mountEntry{})); d != "" {
		t.Errorf("parseMountinfo (-want +got):\n%s", d)
	}
	if _, err := parseMountinfo(strings.NewReader("1 2 3\n")); err == nil {
		t.Error("malformed line accepted")
	}
}

func TestMountFlags(t *testing.T) {
	tests := []struct {
		opts string
		want uintptr
	}{
		{"rw,relatime", unix.MS_RELATIME},
		{"rw", unix.MS_STRICTATIME},
		{"ro,nosuid,nodev,noexec,noatime", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME},
		{"rw,nosuid,nodiratime,relatime,nosymfollow", unix.MS_NOSUID | unix.MS_NODIRATIME | unix.MS_RELATIME | unix.MS_NOSYMFOLLOW},
	}
	for _, tt := range tests {
		if got := mountFlags(tt.opts); got != tt.want {
			t.Errorf("mountFlags(%q) = %#x, want %#x", tt.opts, got, tt.want)
		}
	}
}

func TestResolveDirs(t *testing.T) {
	links := map[string]string{ // usrmerge host
		"/usr": "/usr", "/bin": "/usr/bin", "/sbin": "/usr/sbin", "/lib": "/usr/lib",
		"/lib64": "/usr/lib64", "/etc": "/etc", "/opt": "/data/opt", "/missing-target": "/nowhere",
	}
	eval := func(p string) (string, error) {
		if r, ok := links[p]; ok {
			return r, nil
		}
		return "", os.ErrNotExist
	}
	isDir := func(p string) bool { return p != "/nowhere" }
	got := resolveDirs(append(systemDirs, "/missing-target"), eval, isDir)
	want := []string{"/data/opt", "/etc", "/usr"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("resolveDirs (-want +got):\n%s", d)
	}
}

func TestRemountTargets(t *testing.T) {
	mounts := []mountEntry{
		{"/", "rw,relatime"},
		{"/usr", "rw,relatime"},
		{"/usrlocal", "rw"},
		{"/etc/hosts", "rw,nosuid"},
		{"/opt/ws", "rw"},
		{"/opt/ws/sub", "rw"},
		{"/usr", "rw,nodev,relatime"}, // the recursive bind on top
		{"/opt", "rw,noexec"},
	}
	got := remountTargets(mounts, []string{"/etc", "/opt", "/usr"}, []string{"/opt/ws"})
	want := []mountEntry{
		{"/usr", "rw,nodev,relatime"},
		{"/etc/hosts", "rw,nosuid"},
		{"/opt", "rw,noexec"},
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(mountEntry{})); d != "" {
		t.Errorf("remountTargets (-want +got):\n%s", d)
	}
}

func TestPinnedEndpoint(t *testing.T) {
	tests := []struct {
		in     string
		fd     int
		socket string
	}{
		{"unix:///proc/self/fd/7/gateway.sock", 7, "gateway.sock"},
		{"unix:///var/run/gateway.sock", -1, ""},
		{"http://127.0.0.1:1", -1, ""},
		{"unix:///proc/self/fd/x/gateway.sock", -1, ""},
		{"unix:///proc/self/fd/7/", -1, ""},
		{"unix:///proc/self/fd/7/a/b", -1, ""},
	}
	for _, tt := range tests {
		if fd, s := pinnedEndpoint(tt.in); fd != tt.fd || s != tt.socket {
			t.Errorf("pinnedEndpoint(%q) = %d, %q, want %d, %q", tt.in, fd, s, tt.fd, tt.socket)
		}
	}
}

func TestRootfsDirRejectsSymlink(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("/etc", root+"/proc"); err != nil {
		t.Fatal(err)
	}
	if _, err := rootfsDir(root, "proc"); err == nil {
		t.Error("a symlink in the image was accepted as a mount point")
	}
	p, err := rootfsDir(root, "sandbox")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		t.Errorf("rootfsDir did not create %s: %v", p, err)
	}
	if _, err := rootfsDir(root, "sandbox"); err != nil {
		t.Errorf("existing directory: %v", err)
	}
}
