package supervisor_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// TestBinaryPodCapabilities runs the real binary the way a Kubernetes pod
// runs it (internal/compute/kubernetes, docs/kubernetes.md): root, no new
// namespaces, no_new_privs (allowPrivilegeEscalation: false) and a
// bounding set of exactly CHOWN, KILL, SETGID, SETPCAP and SETUID. With
// that set the policy is LOADED and agent processes run confined; without
// SETPCAP (a pod spec that forgot it) the policy is FAILED naming it and
// no agent process starts. The positive case includes a pty session and an
// agent process killed when its client goes away (it fails without KILL).
func TestBinaryPodCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: the supervisor drops privileges for real")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		citest.SkipOrFail(t, "needs setpriv (util-linux) to start the supervisor with a reduced bounding set: %v", err)
	}
	bin := supervisorBinary(t)
	for _, tt := range []struct {
		name, caps string
		wantFailed string // empty: LOADED and agents run
	}{
		{"pod spec set", "+chown,+kill,+setgid,+setpcap,+setuid", ""},
		{"without SETPCAP", "+chown,+kill,+setgid,+setuid", "the supervisor lacks CAP_SETPCAP"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gw := relaytest.Start(t, relaytest.Options{})
			id := "sb-podcaps"
			ws, err := os.MkdirTemp("/var/tmp", "openshell-podcaps-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(ws) })
			gw.SetPolicy(id, &sandboxv1.SandboxPolicy{Version: 1,
				Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true,
					ReadOnly: []string{"/usr", "/bin", "/lib", "/etc"}, ReadWrite: []string{"/tmp"}},
				Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"}})
			cmd := exec.Command(setpriv, "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all,"+tt.caps, "--", bin)
			cmd.Dir = ws
			cmd.Env = []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"OPENSHELL_ENDPOINT=" + gw.Endpoint(),
				"OPENSHELL_SANDBOX_ID=" + id,
				"OPENSHELL_SANDBOX_TOKEN=" + gw.AddSandbox(id),
				"OPENSHELL_WORKSPACE_DIR=" + ws,
				"OPENSHELL_SANDBOX_COMMAND=" + mustJSON(t, []string{"sh", "-c", "grep -E '^(Uid|CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status > main-status; exec sleep 600"}),
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stopAtCleanup(t, cmd, &stderr)
			var st *openshellv1.ReportPolicyStatusRequest
			gw.WaitFor(t, 30*time.Second, "policy status", func(s *relaytest.State) bool {
				if ss := s.Statuses(); len(ss) > 0 {
					st = ss[0]
					return true
				}
				return false
			})
			gw.WaitFor(t, 30*time.Second, "session of the binary", func(s *relaytest.State) bool { return s.Connected(id) })
			got, execErr := execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", "grep -E '^(Uid|CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status"}})
			if tt.wantFailed != "" {
				if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || !strings.Contains(st.GetLoadError(), tt.wantFailed) {
					t.Errorf("policy status = %v %q, want FAILED with %q", st.GetStatus(), st.GetLoadError(), tt.wantFailed)
				}
				if execErr == nil {
					t.Errorf("exec = %+v, want refused", got)
				}
				if _, err := os.Stat(filepath.Join(ws, "main-status")); !os.IsNotExist(err) {
					t.Errorf("main process ran (stat main-status: %v), want none", err)
				}
				return
			}
			if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
				t.Fatalf("policy status = %v %q, want LOADED", st.GetStatus(), st.GetLoadError())
			}
			want := "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
			if execErr != nil || got.code != 0 || got.stdout != want {
				t.Errorf("exec = %+v, %v; want the confined agent:\n%s", got, execErr, want)
			}
			// A pty session, and an agent process of another uid killed
			// when its client goes away (CAP_KILL).
			if got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"id", "-u"}, TTY: true, Cols: 80, Rows: 24}); err != nil || strings.TrimSpace(got.stdout) != "1000" {
				t.Errorf("pty exec id -u = %+v, %v; want 1000", got, err)
			}
			pidFile := filepath.Join(ws, "sleep.pid")
			got, err = execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 600"}, Timeout: time.Second})
			if err != nil || got.code != sshexec.TimeoutExitCode {
				t.Errorf("exec sleep with a timeout = %+v, %v; want exit %d", got, err, sshexec.TimeoutExitCode)
			}
			if b, err := os.ReadFile(pidFile); err != nil {
				t.Errorf("agent pid: %v", err)
			} else {
				proc := "/proc/" + strings.TrimSpace(string(b))
				deadline := time.Now().Add(10 * time.Second)
				for _, err := os.Stat(proc); err == nil; _, err = os.Stat(proc) {
					if time.Now().After(deadline) {
						t.Errorf("agent process %s still alive 10s after its client went away", proc)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			var main []byte
			deadline := time.Now().Add(10 * time.Second)
			for len(main) == 0 && time.Now().Before(deadline) {
				main, _ = os.ReadFile(filepath.Join(ws, "main-status"))
				time.Sleep(20 * time.Millisecond)
			}
			if string(main) != want {
				t.Errorf("main process status = %q, want %q", main, want)
			}
		})
	}
}

// stopAtCleanup waits for the started supervisor cmd in the background and
// stops it when the test ends (SIGTERM, SIGKILL after 15 s), logging its
// stderr when the test failed.
func stopAtCleanup(t *testing.T, cmd *exec.Cmd, stderr *bytes.Buffer) {
	t.Helper()
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
}
