package supervisor_test

import (
	"os"
	"path/filepath"
	"testing"
)

// TestBinaryFilesystemInUserNamespace runs the real binary in a user
// namespace too (as an unprivileged gateway does), where inherited mounts
// have locked flags: read-only system directories on the host filesystem,
// and pivot_root into a busybox root filesystem.
func TestBinaryFilesystemInUserNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root for namespaces")
	}
	rootfs := busyboxImage(t)
	tests := []struct {
		name   string
		rootfs string
		script string
		want   string
	}{
		{
			name:   "host filesystem",
			script: `touch /usr/ro-probe 2>&1; echo ok > ws-file && cat ws-file; pwd`,
			want:   "touch: cannot touch '/usr/ro-probe': Read-only file system\nok\n/sandbox\n",
		},
		{
			name:   "rootfs",
			rootfs: rootfs,
			script: `cat /marker; pwd; echo ok > ws-file && cat ws-file; touch /bin/ro-probe 2>&1; echo x >/dev/null && ls /dev/pts/ptmx; test -e /usr/local/go || echo no-host`,
			want:   "image\n/sandbox\nok\ntouch: /bin/ro-probe: Read-only file system\n/dev/pts/ptmx\nno-host\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startRootSandbox(t, true, tt.rootfs)
			if out, errOut, _ := s.sh(t, tt.script); out != tt.want {
				t.Errorf("stdout = %q, want %q (stderr %q)", out, tt.want, errOut)
			}
			if _, err := os.Stat(filepath.Join(s.work, "ws-file")); err != nil {
				t.Errorf("workspace write did not reach the host workspace: %v", err)
			}
		})
	}
}

// busyboxImage builds a root filesystem holding a static busybox.
func busyboxImage(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		skipOrFail(t, "no static busybox (Debian package busybox-static): %v", err)
	}
	root := filepath.Join(t.TempDir(), "image")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "pwd", "touch", "echo", "ls", "test", "sleep", "mkdir"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte("image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}
