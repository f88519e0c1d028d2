package supervisor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
	"github.com/openshell-go/openshell/internal/supervisor"
)

// startSupervisor runs a supervisor in-process against gw for sandbox id
// and waits until its session is accepted.
func startSupervisor(t testing.TB, gw *relaytest.Gateway, id string, mutate func(*supervisor.Config)) {
	t.Helper()
	tok := gw.AddSandbox(id)
	cfg := supervisor.Config{
		Endpoint:      gw.Endpoint(),
		SandboxID:     id,
		Token:         tok,
		WorkspaceDir:  agentDir(t),
		NoMainProcess: true,
		ReconnectMin:  50 * time.Millisecond,
		ReconnectMax:  500 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Serve(ctx, cfg, io.Discard, testWriter(t)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve() = %v", err)
			}
		case <-time.After(20 * time.Second):
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			out, _ := exec.Command("sh", "-c", "ps -o pid,ppid,pgid,stat,cmd --ppid "+strconv.Itoa(os.Getpid())).CombinedOutput()
			t.Errorf("supervisor did not stop within 20s; children:\n%s\ngoroutines:\n%s", out, buf)
		}
	})
	gw.WaitFor(t, 20*time.Second, "supervisor session", func(s *relaytest.State) bool { return s.Connected(cfg.SandboxID) })
}

// agentDir is a t.TempDir the unprivileged agent user can reach (the
// per-test parent t.TempDir creates is mode 0700).
func agentDir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func testWriter(t testing.TB) io.Writer {
	if tt, ok := t.(*testing.T); ok && testing.Verbose() {
		return tt.Output()
	}
	return io.Discard
}

type execResult struct {
	stdout, stderr string
	code           int
}

func execIn(t testing.TB, gw *relaytest.Gateway, id string, req sshexec.Request) (execResult, error) {
	t.Helper()
	conn, err := gw.Registry().OpenRelay(t.Context(), id, relay.SSHTarget())
	if err != nil {
		return execResult{}, err
	}
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	code, err := sshexec.Exec(t.Context(), conn, req)
	return execResult{out.String(), errb.String(), code}, err
}

func TestExec(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-exec", nil)
	wd := agentDir(t)
	tests := []struct {
		name string
		req  sshexec.Request
		want execResult
	}{
		{"true", sshexec.Request{Command: []string{"true"}}, execResult{code: 0}},
		{"false", sshexec.Request{Command: []string{"false"}}, execResult{code: 1}},
		{"killed", sshexec.Request{Command: []string{"sh", "-c", "kill -9 $$"}}, execResult{code: 137, stderr: "*"}},
		{"separation", sshexec.Request{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, execResult{"out\n", "err\n", 3}},
		{"stdin", sshexec.Request{Command: []string{"cat"}, Stdin: strings.NewReader("from stdin")}, execResult{stdout: "from stdin"}},
		{"env", sshexec.Request{Command: []string{"sh", "-c", `printf '%s|%s' "$A" "$B_2"`}, Env: map[string]string{"B_2": "it's $HOME", "A": "x y"}}, execResult{stdout: "x y|it's $HOME"}},
		{"workdir", sshexec.Request{Command: []string{"pwd"}, Workdir: wd}, execResult{stdout: wd + "\n"}},
		{"quoting", sshexec.Request{Command: []string{"printf", "%s,", "a b", "", "$(id)", "'"}}, execResult{stdout: "a b,,$(id),',"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := execIn(t, gw, "sb-exec", tt.req)
			if err != nil {
				t.Fatalf("Exec() error = %v", err)
			}
			if tt.want.stderr == "*" { // the shell may report the kill
				got.stderr = "*"
			}
			if got != tt.want {
				t.Errorf("Exec() = %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("invalid env key", func(t *testing.T) {
		_, err := execIn(t, gw, "sb-exec", sshexec.Request{Command: []string{"true"}, Env: map[string]string{"1BAD": "x"}})
		if errdefs.Code(err) != codes.InvalidArgument {
			t.Errorf("Exec(bad env) = %v, want InvalidArgument", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		got, err := execIn(t, gw, "sb-exec", sshexec.Request{Command: []string{"sleep", "30"}, Timeout: 300 * time.Millisecond})
		if err != nil || got.code != sshexec.TimeoutExitCode {
			t.Fatalf("Exec(sleep 30, timeout) = %+v, %v; want code 124", got, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("timeout took %s", d)
		}
	})
}

type countWriter struct {
	w io.Writer
	n int
}

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return c.w.Write(p) }

func TestExecLargeOutputChecksum(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-big", nil)
	conn, err := gw.Registry().OpenRelay(t.Context(), "sb-big", relay.SSHTarget())
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	cw := &countWriter{w: h}
	var errb bytes.Buffer
	// stdout carries 10 MB; stderr carries the sum computed inside.
	code, err := sshexec.Exec(t.Context(), conn, sshexec.Request{
		Command: []string{"sh", "-c", "f=$(mktemp); head -c 10485760 /dev/urandom > $f; cat $f; sha256sum $f | cut -d' ' -f1 >&2; rm $f"},
		Stdout:  cw, Stderr: &errb,
	})
	if err != nil || code != 0 {
		t.Fatalf("Exec() = %d, %v (stderr %q)", code, err, errb.String())
	}
	if cw.n != 10<<20 {
		t.Fatalf("stdout bytes = %d, want %d", cw.n, 10<<20)
	}
	if got, want := hexSum(h.Sum(nil)), strings.TrimSpace(errb.String()); got != want {
		t.Errorf("sha256(stdout) = %s, inside %s", got, want)
	}
}

func hexSum(b []byte) string {
	const hx = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, hx[c>>4], hx[c&15])
	}
	return string(out)
}

func TestInteractivePTY(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-pty", nil)
	conn, err := gw.Registry().OpenRelay(t.Context(), "sb-pty", relay.SSHTarget())
	if err != nil {
		t.Fatal(err)
	}
	stdinR, stdinW := io.Pipe()
	resize := make(chan sshexec.WindowSize, 1)
	out := &syncBuffer{changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	var code int
	var execErr error
	go func() {
		defer close(done)
		code, execErr = sshexec.Exec(t.Context(), conn, sshexec.Request{
			Command: []string{"sh"}, TTY: true, Cols: 80, Rows: 24,
			Stdin: stdinR, Resize: resize, Stdout: out,
		})
	}()
	stdinW.Write([]byte("stty size; echo TERM=$TERM; tty\n"))
	out.waitFor(t, "24 80")
	out.waitFor(t, "TERM=xterm-256color")
	out.waitFor(t, "/dev/pts/")
	resize <- sshexec.WindowSize{Cols: 132, Rows: 43}
	// stty reads the size after the window-change has been applied; poll.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "43 132") {
		if time.Now().After(deadline) {
			t.Fatalf("no resized stty output; got %q", out.String())
		}
		stdinW.Write([]byte("stty size\n"))
		out.waitChange(200 * time.Millisecond)
	}
	stdinW.Write([]byte("exit 7\n"))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("interactive session did not end")
	}
	if execErr != nil || code != 7 {
		t.Errorf("Exec() = %d, %v; want 7", code, execErr)
	}
}

func TestInteractiveCtrlD(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-ctrld", nil)
	conn, err := gw.Registry().OpenRelay(t.Context(), "sb-ctrld", relay.SSHTarget())
	if err != nil {
		t.Fatal(err)
	}
	stdinR, stdinW := io.Pipe()
	out := &syncBuffer{changed: make(chan struct{}, 1)}
	done := make(chan int, 1)
	go func() {
		code, _ := sshexec.Exec(t.Context(), conn, sshexec.Request{TTY: true, Stdin: stdinR, Stdout: out})
		done <- code
	}()
	stdinW.Write([]byte("PS1='P> '; echo READY\n"))
	// Wait for the prompt after the command's output: the shell is then
	// reading a fresh line, where Ctrl-D means end of input.
	out.waitForFunc(t, "prompt", func(s string) bool {
		i := strings.LastIndex(s, "READY")
		// Cutset: spaces and the bytes of the ESC[?2004h mode sequence.
		return i >= 0 && strings.HasSuffix(strings.TrimRight(s, " \x1b[?204h"), "P>")
	})
	stdinW.Write([]byte{4}) // Ctrl-D at an empty prompt ends the login shell
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("shell exit code = %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("shell did not exit on Ctrl-D; output %q", out.String())
	}
}

type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) waitChange(d time.Duration) {
	select {
	case <-s.changed:
	case <-time.After(d):
	}
}

func (s *syncBuffer) waitFor(t testing.TB, substr string) {
	t.Helper()
	s.waitForFunc(t, strconv.Quote(substr), func(out string) bool { return strings.Contains(out, substr) })
}

func (s *syncBuffer) waitForFunc(t testing.TB, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(s.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("output never showed %s; got %q", what, s.String())
		}
		s.waitChange(100 * time.Millisecond)
	}
}

// echoServer listens on loopback (inside the in-process sandbox) and echoes.
func echoServer(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	return l.Addr().(*net.TCPAddr).Port
}

func TestTCPRelay100MB(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-tcp", nil)
	port := echoServer(t)
	conn, err := gw.Registry().OpenRelay(t.Context(), "sb-tcp", relay.TCPTarget("127.0.0.1", uint32(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const size = 100 << 20
	sent, recv := sha256.New(), sha256.New()
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64*1024)
		rnd := newXorshift(1)
		for left := size; left > 0; {
			n := min(left, len(buf))
			rnd.fill(buf[:n])
			sent.Write(buf[:n])
			if _, err := conn.Write(buf[:n]); err != nil {
				t.Errorf("Write: %v", err)
				return
			}
			left -= n
		}
	})
	n, err := io.CopyN(recv, conn, size)
	wg.Wait()
	if err != nil || n != size {
		t.Fatalf("CopyN = %d, %v", n, err)
	}
	if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatal("echoed bytes differ from sent bytes")
	}
}

type xorshift uint64

func newXorshift(seed uint64) *xorshift { x := xorshift(seed*2654435761 + 1); return &x }
func (x *xorshift) fill(b []byte) {
	for i := range b {
		*x ^= *x << 13
		*x ^= *x >> 7
		*x ^= *x << 17
		b[i] = byte(*x)
	}
}

func TestTCPRelayRefusesNonLoopback(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-tcpno", nil)
	for _, host := range []string{"10.0.0.1", "example.com", "0.0.0.0"} {
		_, err := gw.Registry().OpenRelay(t.Context(), "sb-tcpno", relay.TCPTarget(host, 22))
		if errdefs.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not a loopback address") {
			t.Errorf("OpenRelay(tcp %s) = %v, want refusal", host, err)
		}
	}
	// localhost and ::1-style names are allowed (a closed port fails to dial, not the policy).
	_, err := gw.Registry().OpenRelay(t.Context(), "sb-tcpno", relay.TCPTarget("localhost", 1))
	if err == nil || strings.Contains(err.Error(), "not a loopback address") {
		t.Errorf("OpenRelay(localhost:1) = %v, want a dial error", err)
	}
}

func TestReconnectAfterGatewayRestart(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-re", nil)
	if got, err := execIn(t, gw, "sb-re", sshexec.Request{Command: []string{"echo", "one"}}); err != nil || got.stdout != "one\n" {
		t.Fatalf("exec before restart = %+v, %v", got, err)
	}
	gw.Restart(t)
	if _, ok := gw.Registry().Connected("sb-re"); ok {
		t.Fatal("fresh registry already has a session")
	}
	// OpenRelay waits for the supervisor to reconnect.
	got, err := execIn(t, gw, "sb-re", sshexec.Request{Command: []string{"echo", "two"}})
	if err != nil || got.stdout != "two\n" {
		t.Fatalf("exec after restart = %+v, %v", got, err)
	}
}

func TestMainProcessExitAndLogs(t *testing.T) {
	tests := []struct {
		name    string
		command []string
		tty     bool
		code    int32
		log     string
	}{
		{"exit code", []string{"sh", "-c", "echo hello-from-main; echo oops >&2; exit 3"}, false, 3, "hello-from-main"},
		{"signal", []string{"sh", "-c", "echo bye; kill -TERM $$"}, false, 143, "bye"},
		{"tty", []string{"sh", "-c", "tty >/dev/null && echo on-a-tty"}, true, 0, "on-a-tty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw := relaytest.Start(t, relaytest.Options{})
			id := "sb-main-" + strings.ReplaceAll(tt.name, " ", "-")
			startSupervisor(t, gw, id, func(c *supervisor.Config) {
				c.NoMainProcess = false
				c.Command = tt.command
				c.TTY = tt.tty
				c.InstanceID = "inst-" + id
			})
			gw.WaitFor(t, 20*time.Second, "exit report", func(s *relaytest.State) bool { return len(s.Exits()) > 0 })
			gw.WaitFor(t, 20*time.Second, "main process log line", func(s *relaytest.State) bool { return s.HasLog(id, tt.log) })
			gw.WaitFor(t, 5*time.Second, "supervisor log line", func(s *relaytest.State) bool { return s.HasLog(id, "main process exited") })
			gw.WaitFor(t, time.Second, "", func(s *relaytest.State) bool {
				e := s.Exits()[0]
				if e.GetSandboxId() != id || e.GetInstanceId() != "inst-"+id || e.GetExitCode() != tt.code {
					t.Errorf("exit report = %v, want code %d for %s", e, tt.code, id)
				}
				return true
			})
		})
	}
}

// TestPolicyWatch: a policy version stored after the supervisor started is
// picked up by polling and reported: here the supervisor has no network
// namespace of its own, so network rules are FAILED with that reason, a
// change of a static section is FAILED as such, and a version equal in
// everything but the network sections without rules is LOADED.
func TestPolicyWatch(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	base := &sandboxv1.SandboxPolicy{Version: 1, Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}}}
	gw.SetPolicy("sb-watch", base)
	startSupervisor(t, gw, "sb-watch", nil)
	status := func(version uint32) func(*relaytest.State) *openshellv1.ReportPolicyStatusRequest {
		return func(s *relaytest.State) *openshellv1.ReportPolicyStatusRequest {
			for _, st := range s.Statuses() {
				if st.GetVersion() == version {
					return st
				}
			}
			return nil
		}
	}
	wait := func(version uint32, want openshellv1.PolicyStatus, reason string) {
		t.Helper()
		gw.WaitFor(t, 10*time.Second, fmt.Sprintf("version %d %v", version, want), func(s *relaytest.State) bool {
			st := status(version)(s)
			return st != nil && st.GetStatus() == want && st.GetLoadError() == reason
		})
	}
	wait(1, openshellv1.PolicyStatus_POLICY_STATUS_LOADED, "")

	withRules := proto.Clone(base).(*sandboxv1.SandboxPolicy)
	withRules.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}}}
	gw.SetPolicy("sb-watch", withRules)
	wait(2, openshellv1.PolicyStatus_POLICY_STATUS_FAILED,
		"network policies are not enforced as written: no egress proxy runs: the sandbox has no network namespace of its own, so a proxy could be bypassed (rules: gh)")

	static := proto.Clone(base).(*sandboxv1.SandboxPolicy)
	static.Filesystem.ReadOnly = append(static.Filesystem.ReadOnly, "/opt")
	gw.SetPolicy("sb-watch", static)
	wait(3, openshellv1.PolicyStatus_POLICY_STATUS_FAILED,
		"filesystem, landlock and process sections apply at sandbox start only; the new version is not applied")

	gw.SetPolicy("sb-watch", proto.Clone(base).(*sandboxv1.SandboxPolicy))
	wait(4, openshellv1.PolicyStatus_POLICY_STATUS_LOADED, "")
}

func TestPolicySyncAndStatus(t *testing.T) {
	t.Run("seeds default policy and reports it enforced", func(t *testing.T) {
		gw := relaytest.Start(t, relaytest.Options{})
		startSupervisor(t, gw, "sb-pol", nil)
		gw.WaitFor(t, 10*time.Second, "LOADED status for the enforced default policy", func(s *relaytest.State) bool {
			st := s.Statuses()
			return len(st) == 1 && st[0].GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED && st[0].GetVersion() == 1 &&
				st[0].GetLoadError() == "" && s.Policy("sb-pol").GetFilesystem().GetIncludeWorkdir()
		})
	})
	t.Run("keeps gateway policy", func(t *testing.T) {
		gw := relaytest.Start(t, relaytest.Options{})
		gw.SetPolicy("sb-pol2", &sandboxv1.SandboxPolicy{Version: 9})
		gw.SetPolicy("sb-pol2", &sandboxv1.SandboxPolicy{Version: 9})
		startSupervisor(t, gw, "sb-pol2", nil)
		gw.WaitFor(t, 10*time.Second, "LOADED status v2", func(s *relaytest.State) bool {
			st := s.Statuses()
			return len(st) == 1 && st[0].GetVersion() == 2 && st[0].GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED &&
				st[0].GetLoadError() == "" && s.Policy("sb-pol2").GetVersion() == 9
		})
	})
	t.Run("network rules are reported FAILED and the session still comes up", func(t *testing.T) {
		gw := relaytest.Start(t, relaytest.Options{})
		gw.SetPolicy("sb-pol3", &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}},
		}})
		startSupervisor(t, gw, "sb-pol3", nil)
		gw.WaitFor(t, 10*time.Second, "FAILED status and a session", func(s *relaytest.State) bool {
			st := s.Statuses()
			return len(st) == 1 && st[0].GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_FAILED &&
				st[0].GetLoadError() == "network policies are not enforced as written: no egress proxy runs: the sandbox has no network namespace of its own, so a proxy could be bypassed (rules: gh)" &&
				s.Connected("sb-pol3")
		})
	})
}

func TestStartupGivesUp(t *testing.T) {
	cfg := supervisor.Config{
		Endpoint:       "unix://" + filepath.Join(t.TempDir(), "nobody.sock"),
		SandboxID:      "sb-x",
		Token:          "t",
		NoMainProcess:  true,
		StartupTimeout: 700 * time.Millisecond,
	}
	start := time.Now()
	err := supervisor.Serve(t.Context(), cfg, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "GetSandboxConfig") {
		t.Fatalf("Serve(no gateway) = %v, want a GetSandboxConfig error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %s", d)
	}
	if supervisor.ExitCode(err) == 0 {
		t.Error("ExitCode = 0 for a startup failure")
	}
}

func TestTokenRefreshAndServiceAccountExchange(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{TokenTTL: 3 * time.Second})
	gw.AddSandbox("sb-sa") // the sandbox exists; its JWT comes from the exchange
	saFile := filepath.Join(t.TempDir(), "sa-token")
	if err := os.WriteFile(saFile, []byte("projected-sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.AddServiceAccountToken("projected-sa-token", "sb-sa")
	startSupervisor(t, gw, "sb-sa-unused", func(c *supervisor.Config) {
		c.SandboxID = "sb-sa"
		c.Token = ""
		c.K8sSATokenFile = saFile
	})
	// exp = iat+3s: refreshed at ~2.4s, then again ~2.4s later.
	gw.WaitFor(t, 15*time.Second, "two token refreshes", func(s *relaytest.State) bool { return s.Refreshes() >= 2 })
	if got, err := execIn(t, gw, "sb-sa", sshexec.Request{Command: []string{"echo", "ok"}}); err != nil || got.stdout != "ok\n" {
		t.Fatalf("exec after refresh = %+v, %v", got, err)
	}
}

// TestConfigFromEnvLogLevels: every spec.log_level the gateway accepts
// (lifecycle.LogLevels, OpenShell's set) starts a supervisor.
func TestConfigFromEnvLogLevels(t *testing.T) {
	for lvl, want := range map[string]slog.Level{
		"trace": slog.LevelDebug - 4, "TRACE": slog.LevelDebug - 4, "debug": slog.LevelDebug,
		"info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError,
	} {
		cfg, err := supervisor.ConfigFromEnv(func(k string) string {
			if k == supervisor.EnvLogLevel {
				return lvl
			}
			return ""
		})
		if err != nil || cfg.LogLevel != want {
			t.Errorf("ConfigFromEnv(%s=%s) = level %v, %v; want %v", supervisor.EnvLogLevel, lvl, cfg.LogLevel, err, want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		supervisor.EnvEndpoint:       "https://gw:8443",
		supervisor.EnvSandboxID:      "sb-1",
		supervisor.EnvCommand:        `["python3","-m","http.server"]`,
		supervisor.EnvTTY:            "true",
		supervisor.EnvPrivateTmp:     "1",
		supervisor.EnvStartupTimeout: "45",
	}
	cfg, err := supervisor.ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Endpoint != "https://gw:8443" || !cfg.TTY || !cfg.PrivateTmp || cfg.StartupTimeout != 45*time.Second || strings.Join(cfg.Command, " ") != "python3 -m http.server" {
		t.Errorf("ConfigFromEnv() = %+v", cfg)
	}
	for _, bad := range []map[string]string{
		{supervisor.EnvCommand: "python3"},
		{supervisor.EnvTTY: "maybe"},
		{supervisor.EnvStartupTimeout: "soon"},
	} {
		if _, err := supervisor.ConfigFromEnv(func(k string) string { return bad[k] }); err == nil {
			t.Errorf("ConfigFromEnv(%v) = nil error", bad)
		}
	}
	c := supervisor.Config{SandboxID: "x"}
	if err := c.Validate(); err == nil {
		t.Error("Validate() without endpoint = nil")
	}
	c = supervisor.Config{Endpoint: "ftp://x", SandboxID: "x", Token: "t", NoMainProcess: true}
	if err := supervisor.Serve(t.Context(), c, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "unsupported scheme") {
		t.Errorf("Serve(ftp endpoint) = %v", err)
	}
}

// TestConfigFromEnvDenialFlushInterval: OpenShell's variable sets the
// interval of the policy advisor's submissions (default 10 s, OpenShell's);
// a value that is not a positive number of seconds is refused rather than
// ignored.
func TestConfigFromEnvDenialFlushInterval(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        time.Duration
	}{
		{"default", "", 10 * time.Second},
		{"set", "3", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{supervisor.EnvEndpoint: "unix:///gw.sock", supervisor.EnvSandboxID: "sb-1", supervisor.EnvDenialFlushInterval: tc.value}
			cfg, err := supervisor.ConfigFromEnv(func(k string) string { return env[k] })
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil || cfg.DenialFlushInterval != tc.want {
				t.Errorf("%s=%q: interval = %v, %v; want %v", supervisor.EnvDenialFlushInterval, tc.value, cfg.DenialFlushInterval, err, tc.want)
			}
		})
	}
	for _, bad := range []string{"0", "-1", "1.5", "10s", "soon"} {
		_, err := supervisor.ConfigFromEnv(func(k string) string {
			if k == supervisor.EnvDenialFlushInterval {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), supervisor.EnvDenialFlushInterval) {
			t.Errorf("ConfigFromEnv(%s=%q) = %v, want an error naming the variable", supervisor.EnvDenialFlushInterval, bad, err)
		}
	}
}
