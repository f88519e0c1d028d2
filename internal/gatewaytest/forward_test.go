package gatewaytest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// forward opens ForwardTcp with init and returns the stream.
func forward(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, init *openshellv1.TcpForwardInit) (openshellv1.OpenShell_ForwardTcpClient, error) {
	t.Helper()
	s, err := c.ForwardTcp(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: init}}); err != nil {
		return nil, err
	}
	return s, nil
}

// forwardErr returns the error the gateway ends a refused forward with.
func forwardErr(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, init *openshellv1.TcpForwardInit) error {
	t.Helper()
	s, err := forward(ctx, t, c, init)
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

func freeLocalPort(t *testing.T) uint32 {
	t.Helper()
	return uint32(freePort(t))
}

func TestForwardTcp(t *testing.T) {
	g := Start(t, Options{ExtraArgs: []string{"--ssh-session-ttl-secs", "4"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	port := freeLocalPort(t)
	sb := readySandbox(ctx, t, c, "fwd", HelperCommand("echo", strconv.Itoa(int(port)))...)
	other := readySandbox(ctx, t, c, "other")
	id := sb.GetMetadata().GetId()
	g.InstallHelper(t, id)
	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if sess.GetGatewayPort() != uint32(g.Port) || sess.GetGatewayScheme() != "https" || sess.GetToken() == "" {
		t.Fatalf("CreateSshSession = %+v", sess)
	}
	tcp := func(host string) *openshellv1.TcpForwardInit_Tcp {
		return &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: host, Port: port}}
	}

	t.Run("100MB echo round trip", func(t *testing.T) {
		var s openshellv1.OpenShell_ForwardTcpClient
		// The echo server starts with the sandbox's main process; retry
		// until it listens.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, err = forward(ctx, t, c, &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1"), AuthorizationToken: sess.GetToken()})
			if err != nil {
				t.Fatal(err)
			}
			if err = s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: []byte("ping")}}); err == nil {
				if f, rerr := s.Recv(); rerr == nil && string(f.GetData()) == "ping" {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("echo server never answered: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		const total = 100 << 20
		sent, recv := sha256.New(), sha256.New()
		errc := make(chan error, 1)
		go func() {
			buf := make([]byte, 32<<10)
			for n := 0; n < total; n += len(buf) {
				rand.Read(buf)
				sent.Write(buf)
				if err := s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: buf}}); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		got := 0
		start := time.Now()
		for got < total {
			f, err := s.Recv()
			if err != nil {
				t.Fatalf("after %d bytes: %v", got, err)
			}
			recv.Write(f.GetData())
			got += len(f.GetData())
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if string(sent.Sum(nil)) != string(recv.Sum(nil)) {
			t.Fatal("checksum mismatch")
		}
		t.Logf("100 MiB echoed in %v (%.0f MiB/s each way)", time.Since(start), 100/time.Since(start).Seconds())
		s.CloseSend()
	})

	t.Run("refusals", func(t *testing.T) {
		revoked, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := c.RevokeSshSession(ctx, &openshellv1.RevokeSshSessionRequest{Token: revoked.GetToken()}); err != nil || !r.GetRevoked() {
			t.Fatalf("RevokeSshSession = %v, %v", r, err)
		}
		otherSess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: other.GetMetadata().GetId()})
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			init *openshellv1.TcpForwardInit
			code codes.Code
			msg  string
		}{
			{"missing token", &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1")}, codes.Unauthenticated, "authorization_token is required for ForwardTcp"},
			{"unknown token", &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1"), AuthorizationToken: "00000000-0000-4000-8000-000000000000"}, codes.Unauthenticated, "invalid or expired"},
			{"revoked token", &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1"), AuthorizationToken: revoked.GetToken()}, codes.Unauthenticated, "revoked"},
			{"other sandbox's token", &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1"), AuthorizationToken: otherSess.GetToken()}, codes.PermissionDenied, "does not belong to this sandbox"},
			{"non-loopback target", &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("10.0.0.1"), AuthorizationToken: fresh.GetToken()}, codes.InvalidArgument, "not a loopback address"},
			{"no target", &openshellv1.TcpForwardInit{SandboxId: id, AuthorizationToken: fresh.GetToken()}, codes.InvalidArgument, "target is required"},
		}
		for _, tc := range cases {
			err := forwardErr(ctx, t, c, tc.init)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.code, tc.msg)
			}
		}
		time.Sleep(4 * time.Second) // session TTL
		err = forwardErr(ctx, t, c, &openshellv1.TcpForwardInit{SandboxId: id, Target: tcp("127.0.0.1"), AuthorizationToken: fresh.GetToken()})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), "expired") {
			t.Errorf("expired token: %v, want Unauthenticated expired", err)
		}
	})
}

// sandboxConn dials the gateway's callback socket as sandbox id, with the
// JWT the process driver handed that sandbox.
func sandboxConn(t *testing.T, g *Gateway, id string) (*grpc.ClientConn, context.Context) {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(g.StateDir, "sandboxes", id, "token"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(g.StateDir, "run", "gateway.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+strings.TrimSpace(string(tok)))
}

func TestSandboxIdentityIsScoped(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a := readySandbox(ctx, t, c, "alpha")
	b := readySandbox(ctx, t, c, "beta")
	conn, actx := sandboxConn(t, g, a.GetMetadata().GetId())
	asA := openshellv1.NewOpenShellClient(conn)
	bID := b.GetMetadata().GetId()

	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s as another sandbox: %v, want PermissionDenied", what, err)
		}
	}
	_, err := asA.ReportMainProcessExit(actx, &openshellv1.ReportMainProcessExitRequest{SandboxId: bID, InstanceId: "x", ExitCode: 1})
	denied("ReportMainProcessExit", err)
	push, err := asA.PushSandboxLogs(actx)
	if err == nil {
		_ = push.Send(&openshellv1.PushSandboxLogsRequest{SandboxId: bID, Logs: []*openshellv1.SandboxLogLine{{Message: "forged"}}})
		_, err = push.CloseAndRecv()
	}
	denied("PushSandboxLogs", err)
	rs, err := asA.RelayStream(actx)
	if err == nil {
		_ = rs.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Init{Init: &openshellv1.RelayInit{ChannelId: "not-a-channel"}}})
		_, err = rs.Recv()
	}
	if status.Code(err) == codes.OK || errors.Is(err, io.EOF) {
		t.Errorf("RelayStream with an unknown channel: %v, want an error", err)
	}
	cs, err := asA.ConnectSupervisor(actx)
	if err == nil {
		_ = cs.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{Hello: &openshellv1.SupervisorHello{SandboxId: bID, InstanceId: "x"}}})
		_, err = cs.Recv()
	}
	denied("ConnectSupervisor", err)
	// User RPCs are closed to sandbox principals, and the callback socket
	// serves sandbox RPCs only.
	_, err = asA.ListSandboxes(actx, &openshellv1.ListSandboxesRequest{})
	denied("ListSandboxes", err)
	// b is untouched.
	if got := WaitPhase(ctx, t, c, "beta", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 5*time.Second); got.GetStatus().ExitCode != nil {
		t.Fatalf("beta got an exit code from alpha: %v", got.GetStatus())
	}
	logs, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: bID})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs.GetLogs() {
		if l.GetMessage() == "forged" {
			t.Fatal("alpha pushed a log line into beta")
		}
	}
}
