package gatewaytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// cli runs the real openshell binary against a gateway registered in a
// private config directory.
type cli struct {
	t   *testing.T
	bin string
	env []string
}

func newCLI(t *testing.T, g *Gateway) *cli {
	t.Helper()
	cfg := TempDir(t)
	c := &cli{t: t, bin: filepath.Join(g.BinDir, "openshell"), env: append(os.Environ(),
		"XDG_CONFIG_HOME="+cfg, "XDG_STATE_HOME="+filepath.Join(cfg, "state"),
		"OPENSHELL_LOCAL_TLS_DIR="+filepath.Join(cfg, "no-local-tls"), "OPENSHELL_SYSTEM_GATEWAY_DIR="+filepath.Join(cfg, "system"))}
	c.ok("gateway", "add", "e2e", "--endpoint", "https://"+g.Addr,
		"--ca", filepath.Join(g.TLSDir, "ca.crt"), "--cert", filepath.Join(g.TLSDir, "client", "tls.crt"), "--key", filepath.Join(g.TLSDir, "client", "tls.key"))
	return c
}

func (c *cli) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin, args...)
	cmd.Env = c.env
	return cmd
}

// run returns stdout, stderr and the exit code.
func (c *cli) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := c.cmd(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("openshell %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run("", args...)
	if code != 0 {
		c.t.Fatalf("openshell %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func TestCLIEndToEnd(t *testing.T) {
	g := Start(t, Options{})
	c := newCLI(t, g)

	if out := c.ok("status"); !strings.Contains(out, "Connected") {
		t.Fatalf("status = %q", out)
	}
	if _, errOut, code := c.run("", "sandbox", "create", "--name", "cli", "--detach", "--", "sleep", "infinity"); code != 0 || !strings.Contains(errOut, "Sandbox cli is ready") {
		t.Fatalf("create = %d %q", code, errOut)
	}
	if out := c.ok("sandbox", "list", "--names"); strings.TrimSpace(out) != "cli" {
		t.Fatalf("list --names = %q", out)
	}
	var got struct {
		Metadata struct{ Name, Id string }
		Status   struct{ Phase string }
	}
	if err := json.Unmarshal([]byte(c.ok("sandbox", "get", "cli", "-o", "json")), &got); err != nil || got.Metadata.Name != "cli" || got.Status.Phase != "SANDBOX_PHASE_READY" {
		t.Fatalf("get -o json = %+v, %v", got, err)
	}

	t.Run("exec exit codes and streams", func(t *testing.T) {
		out, errOut, code := c.run("", "sandbox", "exec", "--name", "cli", "--no-tty", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
		if out != "out\n" || errOut != "err\n" || code != 5 {
			t.Fatalf("exec = %q %q %d, want out/err/5", out, errOut, code)
		}
		out, _, code = c.run("piped", "sandbox", "exec", "--name", "cli", "--no-tty", "--", "cat")
		if out != "piped" || code != 0 {
			t.Fatalf("exec stdin = %q %d", out, code)
		}
		_, errOut, code = c.run("", "sandbox", "get", "missing")
		if code != 1 || !strings.Contains(errOut, `sandbox "missing" not found in workspace "default"`) {
			t.Fatalf("get missing = %d %q", code, errOut)
		}
		if _, _, code := c.run("", "sandbox", "exec"); code != 2 {
			t.Fatalf("usage error exit = %d, want 2", code)
		}
	})

	t.Run("connect through a pty", func(t *testing.T) {
		ptmx, err := pty.Start(c.cmd("sandbox", "connect", "cli"))
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		_ = pty.Setsize(ptmx, &pty.Winsize{Rows: 30, Cols: 100})
		if _, err := ptmx.Write([]byte("echo hi-$((40+2)); stty size; exit\n")); err != nil {
			t.Fatal(err)
		}
		screen := readAll(ptmx, 20*time.Second)
		if !strings.Contains(screen, "hi-42") || !strings.Contains(screen, "30 100") {
			t.Fatalf("pty screen lacks the command output and size:\n%s", screen)
		}
	})

	t.Run("ssh-config with OpenSSH", func(t *testing.T) {
		sshBin, err := exec.LookPath("ssh")
		if err != nil {
			citest.SkipOrFail(t, "ssh client not installed (apt-get install openssh-client)")
		}
		block := c.ok("sandbox", "ssh-config", "cli")
		cfgFile := filepath.Join(TempDir(t), "ssh_config")
		if err := os.WriteFile(cfgFile, []byte(block), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sshBin, "-F", cfgFile, "-o", "BatchMode=yes", "openshell-cli", "echo", "via-openssh")
		cmd.Env = c.env
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "via-openssh") {
			t.Fatalf("ssh: %v\n%s\nconfig:\n%s", err, out, block)
		}
		if strings.Contains(block, "Token") && !strings.Contains(block, "token-file") {
			t.Fatalf("ssh-config exposes a token:\n%s", block)
		}
	})

	t.Run("forward 10MB", func(t *testing.T) {
		remote := freePort(t)
		// An echo server inside the sandbox (shares the host network here).
		c.ok(append([]string{"sandbox", "create", "--name", "echo", "--detach", "--"}, HelperCommand("echo", strconv.Itoa(remote))...)...)
		sb, err := g.Client().GetSandbox(t.Context(), &openshellv1.GetSandboxRequest{Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		g.InstallHelper(t, sb.GetSandbox().GetMetadata().GetId())
		local := freePort(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		fwd := exec.CommandContext(ctx, c.bin, "forward", "start", "echo", strconv.Itoa(local)+":"+strconv.Itoa(remote))
		fwd.Env = c.env
		var fwdLog bytes.Buffer
		fwd.Stdout, fwd.Stderr = &fwdLog, &fwdLog
		if err := fwd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); fwd.Wait() }()
		deadline := time.Now().Add(15 * time.Second)
		for {
			conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(local))
			if err == nil {
				conn.Write([]byte("x"))
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				b := make([]byte, 1)
				if n, _ := conn.Read(b); n == 1 {
					conn.SetReadDeadline(time.Time{})
					defer conn.Close()
					roundTrip(t, conn, 10<<20)
					return
				}
				conn.Close()
			}
			if time.Now().After(deadline) {
				t.Fatalf("forward never carried bytes: %v\n%s", err, fwdLog.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	c.ok("sandbox", "stop", "cli")
	if out := c.ok("sandbox", "get", "cli"); !strings.Contains(out, "Stopped") {
		t.Fatalf("after stop: %q", out)
	}
	c.ok("sandbox", "start", "cli")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(c.ok("sandbox", "get", "cli"), "Ready") {
		if time.Now().After(deadline) {
			t.Fatal("sandbox did not return to Ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.ok("sandbox", "delete", "cli", "echo")
	if out := c.ok("sandbox", "list", "--names"); strings.TrimSpace(out) != "" {
		t.Fatalf("list after delete = %q", out)
	}
}

func roundTrip(t *testing.T, conn net.Conn, total int) {
	t.Helper()
	sent, recv := sha256.New(), sha256.New()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for n := 0; n < total; n += len(buf) {
			rand.Read(buf)
			sent.Write(buf)
			if _, err := conn.Write(buf); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	if _, err := io.CopyN(recv, conn, int64(total)); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatal("checksum mismatch through forward")
	}
}

// readAll reads from r until EOF or the timeout.
func readAll(r io.Reader, timeout time.Duration) string {
	buf := &syncBuffer{}
	done := make(chan struct{})
	go func() {
		io.Copy(buf, r)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
	}
	return buf.String()
}
