package gatewaytest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// sandboxShell runs sh -c script (args as $1...) in a sandbox as the agent.
func sandboxShell(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, id, script string, args ...string) (string, string, int32) {
	t.Helper()
	out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: append([]string{"sh", "-c", script, "sh"}, args...)})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	return out, errOut, code
}

// hostBlockDevices lists the block devices in the host's /dev.
func hostBlockDevices(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/dev")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Type()&os.ModeDevice != 0 && e.Type()&os.ModeCharDevice == 0 {
			out = append(out, "/dev/"+e.Name())
		}
	}
	return out
}

// TestSandboxFilesystemEscapes runs, as the agent inside a real
// process-driver sandbox, the reads the issue showed to succeed: the
// gateway's CA and JWT signing keys, another sandbox's token, the gateway
// state directory, /root, /home and the host's block devices. Each must
// fail; the workspace at /sandbox, /tmp and exec keep working, and the
// workspace survives stop/start.
func TestSandboxFilesystemEscapes(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	a := readySandbox(ctx, t, c, "escape-a").GetMetadata().GetId()
	b := readySandbox(ctx, t, c, "escape-b").GetMetadata().GetId()

	secrets := []string{
		filepath.Join(g.TLSDir, "ca.key"),
		filepath.Join(g.TLSDir, "jwt", "signing.pem"),
		filepath.Join(g.StateDir, "sandboxes", b, "token"),
		filepath.Join(g.StateDir, "sandboxes", a, "token"),
	}
	for _, p := range secrets {
		// The attempt only means something while the file exists.
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("host file %s: %v", p, err)
		}
		if out, _, code := sandboxShell(ctx, t, c, a, `cat "$1"`, p); code == 0 {
			t.Errorf("read %s from sandbox a: succeeded (%d bytes)", p, len(out))
		}
	}
	dirs := []string{g.StateDir, g.TLSDir, "/root", "/home", "/sys/block", filepath.Join(g.StateDir, "sandboxes", a, "workspace")}
	for _, d := range dirs {
		if out, _, code := sandboxShell(ctx, t, c, a, `ls -A "$1"`, d); code == 0 {
			t.Errorf("list %s from sandbox a: succeeded (%q)", d, out)
		}
	}
	devs := hostBlockDevices(t)
	if len(devs) == 0 {
		t.Log("no block devices on this host; checking /dev/vda only")
		devs = []string{"/dev/vda"}
	}
	for _, dev := range devs {
		if _, _, code := sandboxShell(ctx, t, c, a, `test -e "$1"`, dev); code == 0 {
			t.Errorf("host block device %s is visible in the sandbox", dev)
		}
	}
	if out, _, _ := sandboxShell(ctx, t, c, a, `env | grep -c '^OPENSHELL_SANDBOX_TOKEN' || true`); strings.TrimSpace(out) != "0" {
		t.Errorf("the agent's environment names the token (%s variables)", strings.TrimSpace(out))
	}
	if out, errOut, code := sandboxShell(ctx, t, c, a, `cat /etc/shadow; touch /usr/probe /probe 2>/dev/null; echo $?`); code != 0 || out != "1\n" {
		t.Errorf("/etc/shadow, /usr, /: %q %q (exit %d), want an empty shadow and read-only system directories", out, errOut, code)
	}

	// Identity: with a root gateway each sandbox's ids are an unprivileged
	// host id range of its own, so a process that escapes the other layers
	// is nobody on the host.
	if os.Geteuid() == 0 {
		bases := map[string]uint64{}
		for name, id := range map[string]string{"a": a, "b": b} {
			out, _, _ := sandboxShell(ctx, t, c, id, `cat /proc/self/uid_map /proc/self/gid_map`)
			f := strings.Fields(out)
			if len(f) != 6 || f[0] != "0" || f[2] != "65536" || f[3] != "0" || f[4] != f[1] || f[5] != "65536" {
				t.Fatalf("sandbox %s: uid_map, gid_map = %q, want 0 <base> 65536 twice", name, out)
			}
			base, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil || base < 65536 {
				t.Errorf("sandbox %s: root maps to host id %s, want an unprivileged range", name, f[1])
			}
			bases[name] = base
		}
		if bases["a"] == bases["b"] {
			t.Errorf("sandboxes a and b share the host id range %d", bases["a"])
		}
		if _, errOut, code := sandboxShell(ctx, t, c, a, `echo owned > /sandbox/owned`); code != 0 {
			t.Fatalf("write /sandbox/owned: %q", errOut)
		}
		fi, err := os.Stat(filepath.Join(g.StateDir, "sandboxes", a, "workspace", "owned"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); uint64(st.Uid) < bases["a"] || uint64(st.Uid) >= bases["a"]+65536 || uint64(st.Gid) < bases["a"] || uint64(st.Gid) >= bases["a"]+65536 {
			t.Errorf("a file the agent wrote is owned by host %d:%d, want ids of the range from %d", st.Uid, st.Gid, bases["a"])
		}
		if fi, err := os.Stat(filepath.Join(g.StateDir, "sandboxes", a, "token")); err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("token file: mode %v owner %d, want 0600 and the gateway's user", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
		}
	}

	// Positives.
	if out, errOut, code := sandboxShell(ctx, t, c, a, `pwd; echo "$HOME"; echo kept > /sandbox/keep; echo t > /tmp/t && cat /tmp/t`); code != 0 || out != "/sandbox\n/sandbox\nt\n" {
		t.Fatalf("workspace and /tmp: %q %q (exit %d)", out, errOut, code)
	}
	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "escape-a"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "escape-a", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "escape-a"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "escape-a", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 30*time.Second)
	if out, errOut, code := sandboxShell(ctx, t, c, a, `cat /sandbox/keep; test -e /tmp/t || echo fresh-tmp`); code != 0 || out != "kept\nfresh-tmp\n" {
		t.Errorf("after stop/start: %q %q (exit %d), want the workspace kept and a fresh /tmp", out, errOut, code)
	}
}

// TestSandboxImageIsolation: two sandboxes from one dir: image each write
// into the image (a world-writable /data the policy makes read-write: the
// agent is an unprivileged user under Landlock); the image on the host and
// the other sandbox see none of it, and a sandbox's own changes survive
// its stop/start.
func TestSandboxImageIsolation(t *testing.T) {
	root := busyboxRootfs(t)
	if err := os.Mkdir(filepath.Join(root, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "data", "rootfs-marker"), []byte("inside\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "data", "rootfs-marker"), 0o666); err != nil {
		t.Fatal(err)
	}
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ids := map[string]string{}
	for _, name := range []string{"image-a", "image-b"} {
		if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
			Command:  []string{"/bin/sh", "-c", "sleep 1000000"},
			Template: &openshellv1.SandboxTemplate{Image: "dir:" + root},
			Policy: &sandboxv1.SandboxPolicy{Version: 1, Filesystem: &sandboxv1.FilesystemPolicy{
				IncludeWorkdir: true, ReadOnly: []string{"/"}, ReadWrite: []string{"/data", "/tmp"},
			}},
		}}); err != nil {
			t.Fatalf("CreateSandbox(%s): %v", name, err)
		}
		ids[name] = WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute).GetMetadata().GetId()
	}
	a, b := ids["image-a"], ids["image-b"]
	if out, errOut, code := sandboxShell(ctx, t, c, a, `echo changed > /data/rootfs-marker && echo new > /data/new-file && cat /data/rootfs-marker /data/new-file`); code != 0 || out != "changed\nnew\n" {
		t.Fatalf("write into the image root: %q %q (exit %d), want the writes in the sandbox's own layer", out, errOut, code)
	}
	if data, err := os.ReadFile(filepath.Join(root, "data", "rootfs-marker")); err != nil || string(data) != "inside\n" {
		t.Errorf("the image's rootfs-marker on the host = %q, %v, want unchanged", data, err)
	}
	if _, err := os.Stat(filepath.Join(root, "data", "new-file")); err == nil {
		t.Error("a file written in the sandbox appeared in the image directory on the host")
	}
	if out, _, _ := sandboxShell(ctx, t, c, b, `cat /data/rootfs-marker; test -e /data/new-file && echo leaked; true`); out != "inside\n" {
		t.Errorf("sandbox b sees %q, want the image's own rootfs-marker only", out)
	}
	if out, _, code := sandboxShell(ctx, t, c, a, `ls "$1"`, root); code == 0 {
		t.Errorf("the host image directory is reachable from the sandbox: %q", out)
	}
	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "image-a"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "image-a", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "image-a"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "image-a", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 30*time.Second)
	if out, errOut, code := sandboxShell(ctx, t, c, a, `cat /data/new-file`); code != 0 || out != "new\n" {
		t.Errorf("after stop/start: %q %q (exit %d), want the sandbox's own layer kept", out, errOut, code)
	}
}
