package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/mountinfo"
)

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
	m := func(p, o string) mountinfo.Mount { return mountinfo.Mount{MountPoint: p, Options: o} }
	mounts := []mountinfo.Mount{
		m("/", "rw,relatime"),
		m("/usr", "rw,relatime"),
		m("/usrlocal", "rw"),
		m("/etc/hosts", "rw,nosuid"),
		m("/opt/ws", "rw"),
		m("/opt/ws/sub", "rw"),
		m("/usr", "rw,nodev,relatime"), // the recursive bind on top
		m("/opt", "rw,noexec"),
		m("/opt/with space\\back\ttab", "rw,nosuid"), // unescaped by mountinfo.Read
	}
	got := remountTargets(mounts, []string{"/etc", "/opt", "/usr"}, []string{"/opt/ws"})
	want := []mountinfo.Mount{
		m("/usr", "rw,nodev,relatime"),
		m("/etc/hosts", "rw,nosuid"),
		m("/opt", "rw,noexec"),
		m("/opt/with space\\back\ttab", "rw,nosuid"),
	}
	if d := cmp.Diff(want, got); d != "" {
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

func TestWithSandboxUser(t *testing.T) {
	tests := []struct {
		name                  string
		passwd, group         string
		wantPasswd, wantGroup string
	}{
		{
			name:       "1000 free",
			passwd:     "root:x:0:0:root:/root:/bin/bash\n",
			group:      "root:x:0:\n",
			wantPasswd: "root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000:OpenShell sandbox:/sandbox:/bin/sh\n",
			wantGroup:  "root:x:0:\nsandbox:x:1000:\n",
		},
		{
			name:       "1000 taken as uid, 1001 as gid",
			passwd:     "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh",
			group:      "alice:x:1000:\nbob:x:1001:\n",
			wantPasswd: "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nsandbox:x:1002:1002:OpenShell sandbox:/sandbox:/bin/sh\n",
			wantGroup:  "alice:x:1000:\nbob:x:1001:\nsandbox:x:1002:\n",
		},
		{
			name:       "existing sandbox user without group",
			passwd:     "sandbox:x:1500:1600::/sandbox:/bin/sh\n",
			group:      "root:x:0:\n",
			wantPasswd: "sandbox:x:1500:1600::/sandbox:/bin/sh\n",
			wantGroup:  "root:x:0:\nsandbox:x:1600:\n",
		},
		{
			name:       "existing user and group",
			passwd:     "sandbox:x:1000:1000::/sandbox:/bin/sh\n",
			group:      "sandbox:x:1000:\n",
			wantPasswd: "sandbox:x:1000:1000::/sandbox:/bin/sh\n",
			wantGroup:  "sandbox:x:1000:\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, g := withSandboxUser([]byte(tt.passwd), []byte(tt.group), "/bin/sh")
			if string(p) != tt.wantPasswd || string(g) != tt.wantGroup {
				t.Errorf("withSandboxUser() =\n%s\n%s\nwant\n%s\n%s", p, g, tt.wantPasswd, tt.wantGroup)
			}
		})
	}
}

// TestImageLayerFallsBackToCopy: where the kernel refuses the overlay, the
// sandbox gets a private copy of the image in its layer, reused on the
// next start, and the image is never the directory handed out.
func TestImageLayerFallsBackToCopy(t *testing.T) {
	img := filepath.Join(t.TempDir(), "img")
	for _, d := range []string{"bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(img, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(img, "etc", "os-release"), []byte("ID=test\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../etc/os-release", filepath.Join(img, "bin", "link")); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(t.TempDir(), "layer")
	refused := func(lower, upper, work string) error { return unix.ENODEV }
	src, err := imageLayer(img, layer, refused)
	if err != nil {
		t.Fatalf("imageLayer() error = %v", err)
	}
	if want := filepath.Join(layer, "copy"); src != want {
		t.Fatalf("imageLayer() = %q, want the copy %q", src, want)
	}
	if b, err := os.ReadFile(filepath.Join(src, "bin", "link")); err != nil || string(b) != "ID=test\n" {
		t.Errorf("copy: read through the copied symlink = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(src, "etc", "os-release")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("copy: mode of os-release = %v, %v, want 0640", fi.Mode(), err)
	}
	if err := os.WriteFile(filepath.Join(src, "written"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The next start reuses the copy with its writes, without trying overlay.
	called := false
	again, err := imageLayer(img, layer, func(string, string, string) error { called = true; return nil })
	if err != nil || again != src || called {
		t.Errorf("second imageLayer() = %q, %v (overlay tried: %v), want the existing copy", again, err, called)
	}
	if _, err := os.Stat(filepath.Join(img, "written")); err == nil {
		t.Error("a write into the copy reached the image")
	}

	// With overlay available, nothing is copied.
	layer2 := filepath.Join(t.TempDir(), "layer")
	var gotLower string
	src, err = imageLayer(img, layer2, func(lower, upper, work string) error { gotLower = lower; return nil })
	if err != nil || src != "" || gotLower != img {
		t.Errorf("imageLayer() with overlay = %q, %v (lower %q), want the overlay on %s", src, err, gotLower, img)
	}
	if _, err := os.Stat(filepath.Join(layer2, "copy")); err == nil {
		t.Error("a copy was made although overlay worked")
	}
}
