package supervisor_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
	"github.com/openshell-go/openshell/internal/supervisor"
	"github.com/openshell-go/openshell/internal/supervisor/isolation/isolationtest"
)

// confinedSandbox is a supervisor running in this process whose policy
// allows a read-only tools directory (holding the escape helper and a
// setuid-root copy of it) and its workspace, under /var/tmp (not covered
// by the policy's /tmp).
type confinedSandbox struct {
	gw                     *relaytest.Gateway
	id                     string
	ws, tools, secret      string
	escape, suid, mainStat string
}

func startConfined(t *testing.T, id string, process *sandboxv1.ProcessPolicy) *confinedSandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: agent processes drop privileges for real")
	}
	base, err := os.MkdirTemp("/var/tmp", "openshell-confined-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	s := &confinedSandbox{gw: relaytest.Start(t, relaytest.Options{}), id: id,
		ws: filepath.Join(base, "ws"), tools: filepath.Join(base, "tools"), secret: filepath.Join(base, "secret")}
	for _, d := range []string{s.ws, s.tools, s.secret} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.secret, "key"), []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.tools, "data"), []byte("tools\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(isolationtest.EscapeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	s.escape, s.suid = filepath.Join(s.tools, "escape"), filepath.Join(s.tools, "escape-suid")
	for _, p := range []string{s.escape, s.suid} {
		if err := os.WriteFile(p, bin, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(s.suid, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	s.gw.SetPolicy(id, &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/usr", "/bin", "/lib", "/lib64", "/etc", s.tools},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
		Process:  process,
	})
	s.mainStat = filepath.Join(s.ws, "main-status")
	startSupervisor(t, s.gw, id, func(c *supervisor.Config) {
		c.WorkspaceDir = s.ws
		c.NoMainProcess = false
		c.Command = []string{"sh", "-c", s.escape + " status > main-status; exec sleep 600"}
	})
	return s
}

func (s *confinedSandbox) exec(t *testing.T, argv ...string) execResult {
	t.Helper()
	got, err := execIn(t, s.gw, s.id, sshexec.Request{Command: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return got
}

// TestAgentConfinement runs the escape attempts as the agent through the
// supervisor's real spawn paths (main process, exec, SSH pty sessions);
// each must fail. The positives check that the agent still works.
func TestAgentConfinement(t *testing.T) {
	s := startConfined(t, "sb-confined", nil)
	s.gw.WaitFor(t, 10*time.Second, "LOADED status", func(st *relaytest.State) bool {
		ss := st.Statuses()
		return len(ss) == 1 && ss[0].GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED
	})
	wantStatus := []string{
		"Uid: 1000 1000 1000 1000", "Gid: 1000 1000 1000 1000", "Groups:\n",
		"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
		"CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2",
	}
	checkStatus := func(t *testing.T, where, out string) {
		t.Helper()
		for _, w := range wantStatus {
			if !strings.Contains(out, w) {
				t.Errorf("%s: status lacks %q:\n%s", where, w, out)
			}
		}
	}

	t.Run("main process", func(t *testing.T) {
		var out []byte
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(s.mainStat)
			if err == nil && bytes.Contains(b, []byte("Seccomp:")) {
				out = b
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("main process never wrote its status: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		checkStatus(t, "main process", string(out))
	})
	t.Run("exec", func(t *testing.T) {
		checkStatus(t, "exec", s.exec(t, s.escape, "status").stdout)
	})
	t.Run("ssh pty session", func(t *testing.T) {
		got, err := execIn(t, s.gw, s.id, sshexec.Request{Command: []string{s.escape, "status"}, TTY: true, Cols: 80, Rows: 24})
		if err != nil {
			t.Fatal(err)
		}
		checkStatus(t, "pty session", strings.ReplaceAll(got.stdout, "\r\n", "\n"))
	})

	supervisorPID := strconv.Itoa(os.Getpid())
	escapes := []struct {
		name string
		argv []string
	}{
		{"mount", []string{"mount", s.ws}},
		{"ptrace the supervisor", []string{"ptrace", supervisorPID}},
		{"signal the supervisor", []string{"signal0", supervisorPID}},
		{"unshare -n", []string{"unshare-net"}},
		{"clone a user namespace", []string{"clone-userns"}},
		{"raw socket", []string{"raw-socket"}},
		{"packet socket", []string{"packet-socket"}},
		{"load a module", []string{"init-module"}},
		{"write /proc/sys", []string{"write", "/proc/sys/kernel/hostname"}},
		{"open a block device", []string{"open", "/dev/loop0"}},
		{"write outside read_write", []string{"write", filepath.Join(s.secret, "new")}},
		{"write into read_only", []string{"write", filepath.Join(s.tools, "new")}},
		{"read outside read_only", []string{"read", filepath.Join(s.secret, "key")}},
		{"read the supervisor's environment", []string{"read", "/proc/" + supervisorPID + "/environ"}},
	}
	for _, tt := range escapes {
		t.Run(tt.name, func(t *testing.T) {
			got := s.exec(t, append([]string{s.escape}, tt.argv...)...)
			if got.code != 1 || !strings.HasPrefix(got.stdout, "denied: ") {
				t.Errorf("%v = %d %q %q, want denied", tt.argv, got.code, got.stdout, got.stderr)
			}
		})
	}
	t.Run("setuid-root binary", func(t *testing.T) {
		got := s.exec(t, s.suid, "euid")
		if got.code != 1 || got.stdout != "denied: euid 1000\n" {
			t.Errorf("setuid-root copy = %d %q, want it to run as euid 1000", got.code, got.stdout)
		}
	})
	t.Run("id -u through a shell", func(t *testing.T) {
		if got := s.exec(t, "sh", "-c", "id -u; id -g; id -G"); got.stdout != "1000\n1000\n1000\n" {
			t.Errorf("id = %q, want uid, gid and groups 1000", got.stdout)
		}
	})
	t.Run("read_write is writable", func(t *testing.T) {
		got := s.exec(t, "sh", "-c", "echo hi > f && cat f && echo t > /tmp/x-$$ && rm /tmp/x-$$")
		if got.code != 0 || got.stdout != "hi\n" {
			t.Errorf("write = %d %q %q", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("read_only is readable", func(t *testing.T) {
		if got := s.exec(t, "cat", filepath.Join(s.tools, "data")); got.stdout != "tools\n" {
			t.Errorf("read = %d %q %q", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("supervisor still alive", func(t *testing.T) {
		if got := s.exec(t, "echo", "alive"); got.stdout != "alive\n" {
			t.Errorf("exec after the escape attempts = %q", got.stdout)
		}
	})
}

// TestAgentRunsAsPolicyUser: process.run_as_user/run_as_group apply to
// every agent process.
func TestAgentRunsAsPolicyUser(t *testing.T) {
	s := startConfined(t, "sb-runas", &sandboxv1.ProcessPolicy{RunAsUser: "1500", RunAsGroup: "1600"})
	got := s.exec(t, "sh", "-c", "id -u; id -g")
	if got.stdout != "1500\n1600\n" {
		t.Errorf("id = %q %q, want 1500 and 1600", got.stdout, got.stderr)
	}
}

// TestPolicyStatusTruth: a policy the supervisor cannot enforce is
// reported FAILED with the reason. A hard Landlock requirement on a
// missing path also keeps every agent process from starting; network
// rules (no egress proxy without a network namespace of the sandbox's own)
// do not stop the agent but are not LOADED.
func TestPolicyStatusTruth(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: agent processes drop privileges for real")
	}
	tests := []struct {
		name      string
		policy    *sandboxv1.SandboxPolicy
		wantError string
		agentRuns bool
	}{
		{
			name: "hard requirement on a missing path",
			policy: &sandboxv1.SandboxPolicy{Version: 1,
				Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr", "/bin", "/lib", "/does/not/exist"}, IncludeWorkdir: true},
				Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"}},
			wantError: "landlock path /does/not/exist",
		},
		{
			name: "network rules",
			policy: &sandboxv1.SandboxPolicy{Version: 1,
				NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"api": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.example.com", Port: 443}}}}},
			wantError: "network policies are not enforced",
			agentRuns: true,
		},
		{
			name: "network middlewares",
			policy: &sandboxv1.SandboxPolicy{Version: 1,
				NetworkMiddlewares: map[string]*sandboxv1.NetworkMiddlewareConfig{"m": {Name: "m", Config: &structpb.Struct{}}}},
			wantError: "network middlewares are not enforced",
			agentRuns: true,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw := relaytest.Start(t, relaytest.Options{})
			id := "sb-truth-" + strconv.Itoa(i)
			gw.SetPolicy(id, tt.policy)
			startSupervisor(t, gw, id, nil)
			var st *openshellv1.ReportPolicyStatusRequest
			gw.WaitFor(t, 10*time.Second, "policy status", func(s *relaytest.State) bool {
				if len(s.Statuses()) == 0 {
					return false
				}
				st = s.Statuses()[0]
				return true
			})
			if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || !strings.Contains(st.GetLoadError(), tt.wantError) {
				t.Errorf("status = %v %q, want FAILED with %q", st.GetStatus(), st.GetLoadError(), tt.wantError)
			}
			got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"id", "-u"}})
			if tt.agentRuns && (err != nil || got.stdout != "1000\n") {
				t.Errorf("exec = %+v %v, want the confined agent to run", got, err)
			}
			if !tt.agentRuns && err == nil {
				t.Errorf("exec = %+v, want refused", got)
			}
		})
	}
}

// TestBinaryPrivateNetwork runs the real binary the way the process driver
// does, in a network namespace of its own (as host root and in a user
// namespace): the agent has a working loopback and nothing else, neither
// the host's loopback services nor any other address; the supervisor still
// reaches the gateway through its unix socket.
func TestBinaryPrivateNetwork(t *testing.T) {
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, userns := range []bool{false, true} {
		name := "host root"
		if userns {
			name = "user namespace"
		}
		t.Run(name, func(t *testing.T) {
			s := startRootSandboxWith(t, rootOpts{userns: userns, policy: rootViewPolicy(nil), privateNet: true})
			bin, err := os.ReadFile(isolationtest.EscapeBinary(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.work, "escape"), bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, errOut, code := s.sh(t, `/sandbox/escape loopback`); code != 0 || out != "works loopback\n" {
				t.Errorf("loopback inside the sandbox: %q %q (exit %d)", out, errOut, code)
			}
			if out, _, _ := s.sh(t, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`); out != "lo\n" {
				t.Errorf("interfaces in the sandbox = %q, want lo only", out)
			}
			for _, target := range []string{host.Addr().String(), "192.0.2.1:80", "[2001:db8::1]:80"} {
				if out, _, code := s.sh(t, `/sandbox/escape connect "$1"`, target); code != 1 || !strings.HasPrefix(out, "denied: ") {
					t.Errorf("connect %s from the sandbox = %q (exit %d), want denied", target, out, code)
				}
			}
		})
	}
	t.Run("refuses to start without a network namespace", func(t *testing.T) {
		if os.Geteuid() != 0 {
			citest.SkipOrFail(t, "needs root")
		}
		gw := relaytest.Start(t, relaytest.Options{})
		cmd := exec.Command(supervisorBinary(t))
		cmd.Env = []string{
			"OPENSHELL_ENDPOINT=" + gw.Endpoint(),
			"OPENSHELL_SANDBOX_ID=sb-nonet",
			"OPENSHELL_SANDBOX_TOKEN=" + gw.AddSandbox("sb-nonet"),
			"OPENSHELL_PRIVATE_NETWORK=true",
		}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "not in a network namespace of its own") {
			t.Errorf("supervisor in the host network namespace = %v, %s; want a refusal", err, out)
		}
	})
}
