package gatewaytest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// TestRootFSHostReadOnly checks a host-filesystem sandbox on the process
// driver: system directories are read-only, the workspace is writable and
// /tmp is private.
func TestRootFSHostReadOnly(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	marker, err := os.CreateTemp("", "host-tmp-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })

	id := readySandbox(ctx, t, c, "hostfs").GetMetadata().GetId()
	run := func(script string, args ...string) (string, string, int32) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: append([]string{"sh", "-c", script, "sh"}, args...)})
		if err != nil {
			t.Fatalf("Exec %q: %v", script, err)
		}
		return out, errOut, code
	}
	for _, dir := range []string{"/usr", "/etc", "/bin"} {
		_, errOut, code := run(`touch "$1/openshell-ro-probe"`, dir)
		if code == 0 || !strings.Contains(errOut, "Read-only file system") {
			t.Errorf("touch in %s: exit %d stderr %q, want a read-only file system error", dir, code, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, "openshell-ro-probe")); err == nil {
			os.Remove(filepath.Join(dir, "openshell-ro-probe"))
			t.Errorf("probe file appeared in the host's %s", dir)
		}
	}
	if out, errOut, code := run(`touch ./ok && echo written > ./ok && cat ./ok`); code != 0 || out != "written\n" {
		t.Errorf("workspace write: exit %d stdout %q stderr %q", code, out, errOut)
	}
	out, errOut, code := run(`test -e "$1" && echo host-visible; echo x > /tmp/inside && cat /tmp/inside`, marker.Name())
	if code != 0 || out != "x\n" {
		t.Errorf("private /tmp: exit %d stdout %q stderr %q, want the host marker hidden and /tmp writable", code, out, errOut)
	}
	if _, err := os.Stat("/tmp/inside"); err == nil {
		t.Errorf("the sandbox's /tmp/inside is visible on the host")
	}
	// A fresh /proc: the sandbox sees only its own processes.
	if out, _, code := run(`ls -d /proc/[0-9]* | wc -l`); code != 0 || strings.TrimSpace(out) == "" {
		t.Errorf("list /proc: exit %d %q", code, out)
	} else if n := strings.TrimSpace(out); len(n) > 2 {
		t.Errorf("sandbox sees %s processes in /proc, want only its own", n)
	}
}

// busyboxRootfs builds a tiny root filesystem from a static busybox.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		citest.SkipOrFail(t, "a static busybox is required at %s (Debian package busybox-static)", bb)
	}
	root := filepath.Join(TempDir(t), "rootfs")
	for _, d := range []string{"bin", "etc", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "ls", "cat", "touch", "sleep", "pwd", "echo", "test", "wc", "env", "mount", "true", "false", "id", "hostname", "tty"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/os-release":       "ID=openshell-test-rootfs\n",
		"etc/passwd":           "root:x:0:0:root:/sandbox:/bin/sh\n",
		"rootfs-marker":        "inside\n",
		"usr/bin/.placeholder": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestRootFSImage runs a sandbox in a local root filesystem directory.
func TestRootFSImage(t *testing.T) {
	root := busyboxRootfs(t)
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const name = "rootfs"
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command:  []string{"/bin/sh", "-c", "sleep 1000000"},
		Template: &openshellv1.SandboxTemplate{Image: "dir:" + root},
	}}); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute).GetMetadata().GetId()
	run := func(script string) (string, string, int32) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatalf("Exec %q: %v", script, err)
		}
		return out, errOut, code
	}

	// The agent may not list / (Landlock allows only the policy's paths),
	// but it can tell what exists there.
	out, errOut, code := run(`cat /etc/os-release; test -e /rootfs-marker && echo rootfs-marker; test -d /sandbox && echo sandbox; pwd; test -e /usr/local/go && echo host-go-visible; echo end`)
	if code != 0 {
		t.Fatalf("inspect rootfs: exit %d stderr %q", code, errOut)
	}
	t.Logf("inside the rootfs:\n%s", out)
	for _, want := range []string{"ID=openshell-test-rootfs", "rootfs-marker", "sandbox", "\n/sandbox\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the rootfs: output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "host-go-visible") {
		t.Errorf("the host's /usr/local/go is visible inside the rootfs: %q", out)
	}
	if _, errOut, code := run(`touch /bin/openshell-ro-probe`); code == 0 || !strings.Contains(errOut, "Read-only file system") {
		t.Errorf("touch in the image's /bin: exit %d stderr %q, want read-only", code, errOut)
	}
	if out, errOut, code := run(`echo kept > state.txt && echo t > /tmp/t && cat /tmp/t && ls /dev/pts/ptmx >/dev/null && echo x >/dev/null && echo ok`); code != 0 || out != "t\nok\n" {
		t.Errorf("workspace, /tmp and /dev: exit %d stdout %q stderr %q", code, out, errOut)
	}
	// A pseudo terminal from the sandbox's own devpts instance.
	if out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"tty"}, Tty: true}); err != nil || code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "/dev/pts/") {
		t.Errorf("tty exec: %q %q %d %v, want a /dev/pts terminal", out, errOut, code, err)
	}
	// No way back to the host filesystem through the supervisor's fds.
	if out, _, _ := run(`for f in /proc/1/fd/*; do ls "$f/../../../../../../../.." 2>/dev/null; done | grep -c -x -e work -e rootfs || true`); strings.TrimSpace(out) != "0" {
		t.Errorf("a supervisor fd leads into the host filesystem (%s matches)", strings.TrimSpace(out))
	}

	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StopSandbox: %v", err)
	}
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StartSandbox: %v", err)
	}
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 30*time.Second)
	if out, errOut, code := run(`cat /sandbox/state.txt`); code != 0 || out != "kept\n" {
		t.Errorf("after restart: exit %d stdout %q stderr %q, want the workspace kept", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(root, "sandbox", "state.txt")); err == nil {
		t.Errorf("the workspace file was written into the image directory instead of the workspace")
	}
}
