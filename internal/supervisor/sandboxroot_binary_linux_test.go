package supervisor_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// rootSandbox is a real supervisor binary started the way the process
// driver starts it, with its state (token, workspace, layer) under one
// host directory the sandbox must not see.
type rootSandbox struct {
	gw                    *relaytest.Gateway
	id                    string
	state, tokFile, layer string
	work                  string
}

// Its policy (rootViewPolicy) lets the agent read everything the sandbox's
// mounts show, so the tests see the mount view itself; the agent still
// runs confined (its own user, Landlock write rules, seccomp).
func startRootSandbox(t *testing.T, userns bool, image string) *rootSandbox {
	t.Helper()
	return startRootSandboxWith(t, rootOpts{userns: userns, image: image, policy: rootViewPolicy(nil)})
}

// rootViewPolicy reads everything and writes the workspace, /tmp and rw.
func rootViewPolicy(rw []string) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{Version: 1, Filesystem: &sandboxv1.FilesystemPolicy{
		IncludeWorkdir: true, ReadOnly: []string{"/"}, ReadWrite: append([]string{"/tmp"}, rw...),
	}}
}

// rootOpts are the choices of startRootSandboxWith.
type rootOpts struct {
	userns bool
	// singleID maps only root in the user namespace (as an unprivileged
	// gateway does); otherwise every id up to 65535 maps to itself and
	// setgroups is allowed.
	singleID bool
	image    string
	policy   *sandboxv1.SandboxPolicy // nil: the supervisor seeds its default
	// privateNet starts the supervisor in a network namespace of its own
	// with OPENSHELL_PRIVATE_NETWORK, as the process driver does.
	privateNet bool
}

// startRootSandboxWith is startRootSandbox with every choice explicit.
func startRootSandboxWith(t *testing.T, o rootOpts) *rootSandbox {
	t.Helper()
	userns, singleID, image, policy := o.userns, o.singleID, o.image, o.policy
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root for namespaces")
	}
	bin := supervisorBinary(t)
	s := &rootSandbox{gw: relaytest.Start(t, relaytest.Options{}), id: "sb-root"}
	if policy != nil {
		s.gw.SetPolicy(s.id, policy)
	}
	var err error
	// Outside /tmp, like the gateway's state directory.
	if s.state, err = os.MkdirTemp("/var/tmp", "openshell-state-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.state) })
	s.tokFile = filepath.Join(s.state, "token")
	if err := os.WriteFile(s.tokFile, []byte(s.gw.AddSandbox(s.id)), 0o600); err != nil {
		t.Fatal(err)
	}
	s.work = filepath.Join(s.state, "workspace")
	s.layer = filepath.Join(s.state, "layer")
	if err := os.Mkdir(s.work, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = s.work
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"OPENSHELL_ENDPOINT=" + s.gw.Endpoint(),
		"OPENSHELL_SANDBOX_ID=" + s.id,
		"OPENSHELL_SANDBOX_TOKEN_FILE=" + s.tokFile,
		"OPENSHELL_WORKSPACE_DIR=" + s.work,
		"OPENSHELL_SANDBOX_COMMAND=" + mustJSON(t, []string{"sleep", "600"}),
		"OPENSHELL_PRIVATE_TMP=true",
	}
	if image != "" {
		cmd.Env = append(cmd.Env, "OPENSHELL_ROOTFS="+image, "OPENSHELL_ROOTFS_LAYER="+s.layer)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	if o.privateNet {
		cmd.Env = append(cmd.Env, "OPENSHELL_PRIVATE_NETWORK=true")
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	if userns {
		ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}
		if singleID {
			ids[0].Size = 1
		}
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = ids
		cmd.SysProcAttr.GidMappings = ids
		cmd.SysProcAttr.GidMappingsEnableSetgroups = !singleID
	}
	if err := cmd.Start(); err != nil {
		citest.SkipOrFail(t, "cannot start in new namespaces: %v", err)
	}
	stopAtCleanup(t, cmd, &stderr)
	s.gw.WaitFor(t, 30*time.Second, "session of the binary", func(st *relaytest.State) bool { return st.Connected(s.id) })
	return s
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sh runs script (with args as $1...) in the sandbox as the agent.
func (s *rootSandbox) sh(t *testing.T, script string, args ...string) (string, string, int) {
	t.Helper()
	got, err := execIn(t, s.gw, s.id, sshexec.Request{Command: append([]string{"sh", "-c", script, "sh"}, args...)})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return got.stdout, got.stderr, got.code
}

// hostRootEntries is what / of a host-assembled root holds on this host.
func hostRootEntries(t *testing.T) []string {
	t.Helper()
	want := []string{"dev", "proc", "sandbox", "tmp", "var"}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"} {
		if _, err := os.Lstat("/" + d); err == nil {
			want = append(want, d)
		}
	}
	slices.Sort(want)
	return want
}

// TestSandboxRootEscapes runs the real binary without an image, as root
// of the host and in a user namespace, and tries, as the agent, to reach
// what a sandbox must not see. Each attempt must fail.
func TestSandboxRootEscapes(t *testing.T) {
	for _, userns := range []bool{false, true} {
		name := "host root"
		if userns {
			name = "user namespace"
		}
		t.Run(name, func(t *testing.T) {
			s := startRootSandbox(t, userns, "")
			if out, _, code := s.sh(t, `ls -A /`); code != 0 || strings.Join(strings.Fields(out), " ") != strings.Join(hostRootEntries(t), " ") {
				t.Errorf("ls / = %q (exit %d), want exactly %q", out, code, hostRootEntries(t))
			}
			allowedDev := []string{"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
			if out, _, _ := s.sh(t, `ls -A /dev`); !isSubset(strings.Fields(out), allowedDev) {
				t.Errorf("ls /dev = %q, want only %q (no block devices)", out, allowedDev)
			}
			for _, probe := range []struct{ what, script string }{
				{"token file", `cat "$1"`},
				{"state directory", `ls "$2"`},
				{"host workspace path", `ls "$3"`},
				{"/root", `ls /root`},
				{"/home", `ls /home`},
				{"/dev/vda", `test -e /dev/vda && echo present; exit 1`},
				{"/sys", `ls /sys/block`},
				{"write /usr", `touch /usr/probe`},
				{"write /etc", `touch /etc/probe`},
				{"new top-level directory", `mkdir /probe`},
				{"host file through a supervisor fd", `for f in /proc/1/fd/*; do cat "$f/../../../../../../../../$1" && exit 0; done; exit 1`},
			} {
				out, _, code := s.sh(t, probe.script, s.tokFile, s.state, s.work)
				if code == 0 {
					t.Errorf("%s: reachable from the sandbox (stdout %q)", probe.what, out)
				}
			}
			if out, _, code := s.sh(t, `cat /etc/shadow /etc/gshadow 2>/dev/null; wc -c < /etc/passwd >/dev/null`); code != 0 || out != "" {
				t.Errorf("/etc/shadow and /etc/gshadow read %q (exit %d), want empty", out, code)
			}
			if out, _, _ := s.sh(t, `grep '^sandbox:' /etc/passwd | cut -d: -f1,6; grep -c '^sandbox:' /etc/group`); !strings.HasPrefix(out, "sandbox:/sandbox\n1") {
				t.Errorf("sandbox user in /etc/passwd and /etc/group: %q", out)
			}
			if out, errOut, code := s.sh(t, `pwd; echo w > /sandbox/f && cat "$PWD/f"; echo t > /tmp/t && cat /tmp/t; echo $HOME`); code != 0 || !strings.HasPrefix(out, "/sandbox\nw\nt\n") {
				t.Errorf("workspace and /tmp: %q %q (exit %d)", out, errOut, code)
			}
			if b, err := os.ReadFile(filepath.Join(s.work, "f")); err != nil || string(b) != "w\n" {
				t.Errorf("the workspace write did not reach the host workspace: %q, %v", b, err)
			}
			if _, err := os.Stat("/etc/probe"); err == nil {
				t.Error("a probe reached the host's /etc")
			}
		})
	}
}

func isSubset(got, allowed []string) bool {
	for _, g := range got {
		if !slices.Contains(allowed, g) {
			return false
		}
	}
	return len(got) > 0
}

// TestSandboxImageLayer checks that a dir: image is a read-only lower
// layer: the sandbox writes into its own layer, the image on the host is
// unchanged, and a second sandbox from the same image sees none of it.
func TestSandboxImageLayer(t *testing.T) {
	for _, userns := range []bool{false, true} {
		name := "host root"
		if userns {
			name = "user namespace"
		}
		t.Run(name, func(t *testing.T) {
			image := busyboxImage(t)
			// The agent writes where its policy and the image's modes
			// let it: a world-writable /data, read-write in the policy.
			if err := os.Mkdir(filepath.Join(image, "data"), 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(image, "data"), 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(image, "data", "marker"), []byte("image\n"), 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(image, "data", "marker"), 0o666); err != nil {
				t.Fatal(err)
			}
			before := treeListing(t, image)
			policy := rootViewPolicy([]string{"/data"})
			a := startRootSandboxWith(t, rootOpts{userns: userns, image: image, policy: policy})
			if out, errOut, code := a.sh(t, `echo changed > /data/marker && echo new > /data/new-file && mkdir /data/opt2 && cat /data/marker /data/new-file`); code != 0 || out != "changed\nnew\n" {
				t.Fatalf("write into the image root: %q %q (exit %d), want the writes in the sandbox's layer", out, errOut, code)
			}
			if got := treeListing(t, image); got != before {
				t.Errorf("the image directory changed on the host:\nbefore %s\nafter  %s", before, got)
			}
			b := startRootSandboxWith(t, rootOpts{userns: userns, image: image, policy: policy})
			if out, _, _ := b.sh(t, `cat /data/marker; test -e /data/new-file && echo leaked; true`); out != "image\n" {
				t.Errorf("second sandbox from the same image sees %q, want the image's own marker only", out)
			}
			if out, _, code := a.sh(t, `ls "$1"`, image); code == 0 {
				t.Errorf("the host image directory is reachable inside the sandbox: %q", out)
			}
		})
	}
}

// treeListing is a listing of dir with sizes and modes, for comparisons.
func treeListing(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String() + " " + fi.ModTime().String())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		b.WriteString(";")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
