package supervisor_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// TestBinaryFilesystemInUserNamespace runs the real binary in a user
// namespace too (as an unprivileged gateway does), where inherited mounts
// have locked flags: read-only system directories on the host filesystem,
// and pivot_root into a busybox root filesystem.
func TestBinaryFilesystemInUserNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root for namespaces")
	}
	bin := supervisorBinary(t)
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
			want:   "touch: cannot touch '/usr/ro-probe': Read-only file system\nok\n<ws>\n",
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
			gw := relaytest.Start(t, relaytest.Options{})
			const id = "sb-fs"
			tok := gw.AddSandbox(id)
			tokFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokFile, []byte(tok), 0o600); err != nil {
				t.Fatal(err)
			}
			work, err := os.MkdirTemp("/var/tmp", "openshell-ws-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(work) })
			cmdJSON, _ := json.Marshal([]string{"sleep", "600"})
			cmd := exec.Command(bin)
			cmd.Dir = work
			cmd.Env = []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"OPENSHELL_ENDPOINT=" + gw.Endpoint(),
				"OPENSHELL_SANDBOX_ID=" + id,
				"OPENSHELL_SANDBOX_TOKEN_FILE=" + tokFile,
				"OPENSHELL_WORKSPACE_DIR=" + work,
				"OPENSHELL_SANDBOX_COMMAND=" + string(cmdJSON),
				"OPENSHELL_PRIVATE_TMP=true",
			}
			if tt.rootfs != "" {
				cmd.Env = append(cmd.Env, "OPENSHELL_ROOTFS="+tt.rootfs)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
				UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
				GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
				GidMappingsEnableSetgroups: false,
				Pdeathsig:                  syscall.SIGKILL,
			}
			if err := cmd.Start(); err != nil {
				skipOrFail(t, "cannot start in a user namespace: %v", err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(15 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("supervisor stderr:\n%s", stderr.String())
				}
			})
			gw.WaitFor(t, 30*time.Second, "session of the binary", func(s *relaytest.State) bool { return s.Connected(id) })
			got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", tt.script}})
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			if want := strings.ReplaceAll(tt.want, "<ws>", work); got.stdout != want {
				t.Errorf("stdout = %q, want %q (stderr %q)", got.stdout, want, got.stderr)
			}
			if _, err := os.Stat(filepath.Join(work, "ws-file")); err != nil {
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
	for _, a := range []string{"sh", "cat", "pwd", "touch", "echo", "ls", "test", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte("image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}
