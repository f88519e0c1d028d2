package supervisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// TestBinaryFilesystemInUserNamespace runs the real binary in a user
// namespace too, where inherited mounts have locked flags: read-only
// system directories on the host filesystem, and pivot_root into a busybox
// root filesystem. The namespace maps the agent's ids as well as root;
// TestBinarySingleIDUserNamespace covers one that maps only root.
func TestBinaryFilesystemInUserNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root for namespaces")
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

// TestBinarySingleIDUserNamespace: in a user namespace that maps only the
// supervisor's own id (what an unprivileged gateway creates), the agent
// cannot run as an unprivileged user. The supervisor stays up, reports the
// policy FAILED with the reason, and refuses every agent process.
func TestBinarySingleIDUserNamespace(t *testing.T) {
	s := startRootSandboxWith(t, rootOpts{userns: true, singleID: true})
	var st *openshellv1.ReportPolicyStatusRequest
	s.gw.WaitFor(t, 10*time.Second, "policy status", func(g *relaytest.State) bool {
		if len(g.Statuses()) == 0 {
			return false
		}
		st = g.Statuses()[0]
		return true
	})
	if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || !strings.Contains(st.GetLoadError(), "is not mapped in the supervisor's user namespace") {
		t.Errorf("policy status = %v %q, want FAILED naming the unmapped id", st.GetStatus(), st.GetLoadError())
	}
	if got, err := execIn(t, s.gw, s.id, sshexec.Request{Command: []string{"sh", "-c", "touch ran"}}); err == nil {
		t.Errorf("exec = %+v, want refused", got)
	}
	if _, err := os.Stat(filepath.Join(s.work, "ran")); err == nil {
		t.Error("an agent process ran without its confinement")
	}
}

// busyboxImage builds a root filesystem holding a static busybox.
func busyboxImage(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		citest.SkipOrFail(t, "no static busybox (Debian package busybox-static): %v", err)
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
