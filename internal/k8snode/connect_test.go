package k8snode_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
)

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
	id := g.createReady(ctx, t, name)

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
	conn, chans, reqs, err := ssh.NewClientConn(gatewaytest.ForwardConn(s, stop), "sandbox", &ssh.ClientConfig{
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
