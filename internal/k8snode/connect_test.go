package k8snode_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
)

// forwardConn is a net.Conn over one ForwardTcp stream (what the CLI's
// `sandbox connect` tunnels SSH through).
type forwardConn struct {
	s    openshellv1.OpenShell_ForwardTcpClient
	buf  []byte
	stop context.CancelFunc
}

func (c *forwardConn) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		f, err := c.s.Recv()
		if err != nil {
			return 0, io.EOF
		}
		c.buf = f.GetData()
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *forwardConn) Write(p []byte) (int, error) {
	if err := c.s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: append([]byte(nil), p...)}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *forwardConn) Close() error                     { c.stop(); return nil }
func (c *forwardConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *forwardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *forwardConn) SetDeadline(time.Time) error      { return nil }
func (c *forwardConn) SetReadDeadline(time.Time) error  { return nil }
func (c *forwardConn) SetWriteDeadline(time.Time) error { return nil }

// TestGatewayConnectToPod: an SSH session through the gateway's relay (an
// SSH session token, ForwardTcp to the supervisor's SSH target, as
// `openshell sandbox connect` does) reaches the sandbox in its pod: a
// command runs as the agent user in the pod, and a pty shell answers.
func TestGatewayConnectToPod(t *testing.T) {
	g := startPodGateway(t, "")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const name = "connect"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)

	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s, err := c.ForwardTcp(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: &openshellv1.TcpForwardInit{
		SandboxId: id, AuthorizationToken: sess.GetToken(), Target: &openshellv1.TcpForwardInit_Ssh{Ssh: &openshellv1.SshRelayTarget{}},
	}}}); err != nil {
		t.Fatal(err)
	}
	conn, chans, reqs, err := ssh.NewClientConn(&forwardConn{s: s, stop: stop}, "sandbox", &ssh.ClientConfig{
		User: "sandbox", HostKeyCallback: ssh.InsecureIgnoreHostKey(), //nolint:gosec // relay authorized by the gateway, as in the CLI
	})
	if err != nil {
		t.Fatalf("SSH handshake through the relay: %v", err)
	}
	client := ssh.NewClient(conn, chans, reqs)
	defer client.Close()

	se, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := se.CombinedOutput("hostname; id -u")
	se.Close()
	if f := strings.Fields(string(out)); err != nil || len(f) != 2 || f[0] != name || f[1] != "1000" {
		t.Fatalf("ssh command = %q, %v; want the pod's hostname %q and uid 1000", out, err, name)
	}

	se, err = client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer se.Close()
	if err := se.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatalf("pty: %v", err)
	}
	var pty bytes.Buffer
	se.Stdout = &pty
	se.Stdin = strings.NewReader("echo pty-$((40+2))\nexit\n")
	if err := se.Shell(); err != nil {
		t.Fatal(err)
	}
	if err := se.Wait(); err != nil {
		t.Fatalf("pty shell: %v\n%s", err, pty.String())
	}
	if !strings.Contains(pty.String(), "pty-42") {
		t.Errorf("pty shell output lacks pty-42:\n%q", pty.String())
	}
}
