package supervisor_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// sshClient opens an SSH client to the sandbox's server through a relay,
// the way `openshell ssh` / ForwardTcp with an ssh target reach it.
func sshClient(t testing.TB, gw *relaytest.Gateway, id string) *ssh.Client {
	t.Helper()
	conn, err := gw.Registry().OpenRelay(t.Context(), id, relay.SSHTarget())
	if err != nil {
		t.Fatal(err)
	}
	sc, chans, reqs, err := ssh.NewClientConn(conn, "sandbox", sshexec.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(sc, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSSHDirectTCPIP(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-fwd", nil)
	port := echoServer(t)
	c := sshClient(t, gw, "sb-fwd")

	fwd, err := c.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("Dial(loopback) = %v", err)
	}
	defer fwd.Close()
	msg := strings.Repeat("forward me ", 10000)
	go io.WriteString(fwd, msg)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(fwd, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo through ssh -L = %v", err)
	}
	if _, err := c.Dial("tcp", "192.0.2.1:80"); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("Dial(non-loopback) = %v, want a loopback-only refusal", err)
	}
}

func TestSSHUnknownUserRefused(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-user", nil)
	conn, err := gw.Registry().OpenRelay(t.Context(), "sb-user", relay.SSHTarget())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := sshexec.ClientConfig()
	cfg.User = "root"
	if _, _, _, err := ssh.NewClientConn(conn, "sandbox", cfg); err == nil {
		t.Error("ssh login as root succeeded, want refusal")
	}
}

func TestExecCancelAndShellEnv(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-cancel", nil)

	t.Run("cancel", func(t *testing.T) {
		conn, err := gw.Registry().OpenRelay(t.Context(), "sb-cancel", relay.SSHTarget())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		out := &syncBuffer{changed: make(chan struct{}, 1)}
		done := make(chan error, 1)
		go func() {
			_, err := sshexec.Exec(ctx, conn, sshexec.Request{Command: []string{"sh", "-c", "echo started; exec sleep 60"}, Stdout: out})
			done <- err
		}()
		out.waitFor(t, "started")
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Exec() after cancel = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Exec did not return after cancel")
		}
	})
	t.Run("login shell env and workdir", func(t *testing.T) {
		conn, err := gw.Registry().OpenRelay(t.Context(), "sb-cancel", relay.SSHTarget())
		if err != nil {
			t.Fatal(err)
		}
		wd := agentDir(t)
		stdinR, stdinW := io.Pipe()
		out := &syncBuffer{changed: make(chan struct{}, 1)}
		done := make(chan int, 1)
		go func() {
			code, _ := sshexec.Exec(t.Context(), conn, sshexec.Request{TTY: true, Env: map[string]string{"GREETING": "hello-env"}, Workdir: wd, Stdin: stdinR, Stdout: out})
			done <- code
		}()
		stdinW.Write([]byte("echo \"[$GREETING]\"; pwd; exit 5\n"))
		select {
		case code := <-done:
			if code != 5 {
				t.Errorf("exit code = %d, want 5", code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("shell did not exit; output %q", out.String())
		}
		if s := out.String(); !strings.Contains(s, "[hello-env]") || !strings.Contains(s, wd+"\r\n") {
			t.Errorf("output %q lacks the env value or the workdir", s)
		}
	})
}
