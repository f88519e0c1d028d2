package gatewaytest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/isolation/isolationtest"
)

// TestSandboxEscapeSuite runs the escape attempts as the agent of
// a real process-driver sandbox (gateway, supervisor binary, its user,
// pid and network namespaces, its root), with the escape helper of
// internal/supervisor/isolation copied into the workspace. The policy's
// read_only paths leave /etc out, so /etc/passwd (world-readable in the
// sandbox's root) is outside read_only. Each attempt must be refused:
// mount; ptrace, signal and kill the sandbox's real supervisor (pid 1 of
// the sandbox, the main process's parent), read its environment and
// memory, open its descriptors (the token's among them), inherit one of
// them; unshare -n, a user namespace by clone, setns, raw and packet
// sockets, loading a module, writing /proc/sys, creating a block device,
// writing outside read_write and into read_only, reading outside
// read_only, connecting to an outside address and to the host's loopback
// listener, and, with a root gateway, a setuid binary of the sandbox's
// root. The positives: the agent is the policy's user, the workspace is
// /sandbox and writable, /tmp writable, read_only readable, loopback
// inside works, and the supervisor survives.
func TestSandboxEscapeSuite(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/usr", "/lib", "/lib64", "/bin", "/sbin"},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
		Process:  &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "sandbox"},
	}
	id := createEgressSandbox(ctx, t, c, "escapes", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "escapes", "identity, Landlock and seccomp are enforced")

	// The escape helper, and (root gateway) a setuid copy owned by the
	// sandbox's root, in the workspace.
	src, err := os.ReadFile(isolationtest.EscapeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(g.StateDir, "sandboxes", id, "workspace")
	install := func(name string, uid, gid int, mode os.FileMode) {
		t.Helper()
		tmp := filepath.Join(ws, "."+name+".partial")
		if err := os.WriteFile(tmp, src, 0o755); err != nil {
			t.Fatal(err)
		}
		if uid >= 0 {
			if err := os.Chown(tmp, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(tmp, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	install("escape", -1, -1, 0o755)
	sh := func(script string) (string, string, int32) {
		t.Helper()
		return sandboxShell(ctx, t, c, id, script)
	}

	// The sandbox's supervisor is pid 1 of its pid namespace: the parent
	// of the main process (sleep) and of nothing above it.
	if out, errOut, code := sh(`for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = sleep ] && grep PPid $p/status; done; grep PPid /proc/1/status`); code != 0 || out != "PPid:\t1\nPPid:\t0\n" {
		t.Fatalf("the main process's parent: %q %q (exit %d), want pid 1, the supervisor", out, errOut, code)
	}
	// The policy's user: the sandbox root's passwd entry named sandbox.
	agentUID, errOut, code := sh(`id -u`)
	if agentUID = strings.TrimSpace(agentUID); code != 0 || agentUID == "" || agentUID == "0" {
		t.Fatalf("agent uid %q %q (exit %d)", agentUID, errOut, code)
	}
	// A listener of the host's loopback, in the test's namespace.
	hostL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	go func() {
		for {
			conn, err := hostL.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()

	attempts := []struct{ name, args string }{
		{"mount", "mount /sandbox"},
		{"ptrace the supervisor", "ptrace 1"},
		{"signal the supervisor", "signal0 1"},
		{"kill the supervisor", "kill 1"},
		{"read the supervisor's environment", "read /proc/1/environ"},
		{"open the supervisor's descriptors (its token among them)", "open /proc/1/fd"},
		{"read the supervisor's memory", "read /proc/1/mem"},
		{"inherit a descriptor of the supervisor", "fds"},
		{"unshare -n", "unshare-net"},
		{"user and network namespaces by clone", "clone-userns"},
		{"setns", "setns"},
		{"raw socket", "raw-socket"},
		{"packet socket", "packet-socket"},
		{"load a module", "init-module"},
		{"load a module from a file", "finit-module"},
		{"write /proc/sys", "write /proc/sys/kernel/hostname"},
		{"create a block device", "mknod /sandbox/blk"},
		{"write outside read_write", "write /etc/escaped"},
		{"write into read_only", "write /usr/escaped"},
		{"read outside read_only", "read /etc/passwd"},
		{"connect to an outside address", "connect 192.0.2.1:80"},
		{"connect to the host's loopback", "connect " + hostL.Addr().String()},
	}
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			if out, errOut, code := sh("/sandbox/escape " + a.args); code != 1 || !strings.HasPrefix(out, "denied: ") {
				t.Errorf("escape %s = exit %d %q %q, want denied", a.args, code, out, errOut)
			}
		})
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the gateway maps no id range, the setuid case is not run")
	} else {
		t.Run("setuid binary of the sandbox's root", func(t *testing.T) {
			out, _, _ := sh(`cat /proc/self/uid_map /proc/self/gid_map`)
			f := strings.Fields(out)
			if len(f) != 6 || f[0] != "0" || f[3] != "0" {
				t.Fatalf("uid_map, gid_map = %q", out)
			}
			uid, _ := strconv.Atoi(f[1])
			gid, _ := strconv.Atoi(f[4])
			install("escape-suid", uid, gid, 0o755|os.ModeSetuid)
			fi, err := os.Stat(filepath.Join(ws, "escape-suid"))
			if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
				t.Fatalf("setuid copy: %v %v", fi, err)
			}
			if out, errOut, code := sh("ls -ln /sandbox/escape-suid | cut -d' ' -f1,3; /sandbox/escape-suid euid"); code != 1 || out != "-rwsr-xr-x 0\ndenied: euid "+agentUID+"\n" {
				t.Errorf("setuid-root (sandbox root) binary = exit %d %q %q, want it owned by root and run as euid %s", code, out, errOut, agentUID)
			}
		})
	}

	// Positives.
	if c, err := net.DialTimeout("tcp", hostL.Addr().String(), 3*time.Second); err != nil {
		t.Errorf("control: the host's loopback listener from the test: %v", err)
	} else {
		c.Close()
	}
	if out, errOut, code := sh(`echo "$USER"; id -u; pwd; echo w > /sandbox/w && cat /sandbox/w; echo t > /tmp/t && cat /tmp/t; head -c 4 /usr/bin/env | tail -c 3; echo; /sandbox/escape loopback; grep PPid /proc/1/status`); code != 0 ||
		out != "sandbox\n"+agentUID+"\n/sandbox\nw\nt\nELF\nworks loopback\nPPid:\t0\n" {
		t.Errorf("positives = exit %d %q %q", code, out, errOut)
	}
}
