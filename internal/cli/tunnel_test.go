package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

type forwardStream = grpc.BidiStreamingServer[openshellv1.TcpForwardFrame, openshellv1.TcpForwardFrame]

// streamConn adapts the server side of a ForwardTcp stream (after init) to
// an io.ReadWriter for the fake's targets.
type streamConn struct {
	s   forwardStream
	buf []byte
}

func (c *streamConn) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		f, err := c.s.Recv()
		if err != nil {
			return 0, err
		}
		c.buf = f.GetData()
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *streamConn) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 32 << 10 {
		end := min(off+32<<10, len(p))
		if err := c.s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: append([]byte(nil), p[off:end]...)}}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// forwardFake answers ForwardTcp: a tcp target is an echo server that also
// records the SHA-256 of what it received; an ssh target is served by
// sshTarget. Both require the token CreateSshSession handed out.
type forwardFake struct {
	*fakeGateway
	mu        sync.Mutex
	inits     []*openshellv1.TcpForwardInit
	received  [][32]byte
	sshTarget func(net.Conn)
}

func newForwardFake() *forwardFake {
	ff := &forwardFake{fakeGateway: execFake()}
	ff.forwardTCP = func(s forwardStream) error {
		first, err := s.Recv()
		if err != nil {
			return err
		}
		init := first.GetInit()
		if init == nil {
			return status.Error(codes.InvalidArgument, "first frame must be init")
		}
		if init.GetAuthorizationToken() != "tok-"+init.GetSandboxId() {
			return status.Error(codes.Unauthenticated, "authorization_token is required for ForwardTcp")
		}
		ff.mu.Lock()
		ff.inits = append(ff.inits, init)
		ff.mu.Unlock()
		conn := &streamConn{s: s}
		if tcp := init.GetTcp(); tcp != nil {
			if tcp.GetHost() != "127.0.0.1" {
				return status.Error(codes.InvalidArgument, "tcp host must be loopback")
			}
			h := sha256.New()
			if _, err := io.Copy(io.MultiWriter(conn, h), conn); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			var sum [32]byte
			copy(sum[:], h.Sum(nil))
			ff.mu.Lock()
			ff.received = append(ff.received, sum)
			ff.mu.Unlock()
			return nil
		}
		if ff.sshTarget == nil {
			_, err := io.Copy(conn, conn) // echo
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return err
		}
		a, b := net.Pipe()
		var wg sync.WaitGroup
		wg.Go(func() { ff.sshTarget(b) })
		wg.Go(func() { _, _ = io.Copy(conn, a) })
		_, _ = io.Copy(a, conn)
		a.Close()
		wg.Wait()
		return nil
	}
	return ff
}

func TestForwardBridges10MB(t *testing.T) {
	ff := newForwardFake()
	ep := ff.serve(t)
	tt := newTester(t)
	addrCh := make(chan net.Addr, 1)
	tt.setup = func(a *app) { a.onListen = func(ad net.Addr) { addrCh <- ad } }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan result, 1)
	go func() { done <- tt.runCtx(ctx, "--gateway-endpoint", ep, "forward", "start", "box", "0:8080") }()
	var addr net.Addr
	select {
	case addr = <-addrCh:
	case r := <-done:
		t.Fatalf("forward ended early: %v %q", r.err, r.stderr)
	case <-time.After(10 * time.Second):
		t.Fatal("forward did not listen within 10s")
	}

	const size = 10 << 20
	payload := make([]byte, size)
	_, _ = rand.Read(payload)
	want := sha256.Sum256(payload)
	for conn := range 2 { // two connections share one SSH session token
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		writeErr := make(chan error, 1)
		go func() {
			_, err := c.Write(payload)
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			writeErr <- err
		}()
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			t.Fatalf("conn %d: read: %v", conn, err)
		}
		if err := <-writeErr; err != nil {
			t.Fatalf("conn %d: write: %v", conn, err)
		}
		c.Close()
		if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("conn %d: echoed %d bytes with a different checksum, want %d bytes sha256 %x", conn, n, size, want)
		}
	}
	cancel()
	if r := <-done; r.err != nil {
		t.Errorf("forward start returned %v", r.err)
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if len(ff.received) != 2 || ff.received[0] != want || ff.received[1] != want {
		t.Errorf("gateway side saw checksums %x, want 2 x %x", ff.received, want)
	}
	for _, in := range ff.inits {
		if in.GetSandboxId() != "id-box" || in.GetTcp().GetPort() != 8080 {
			t.Errorf("init = %v", in)
		}
	}
	sessions := 0
	for _, c := range ff.Calls() {
		if c == "CreateSshSession" {
			sessions++
		}
	}
	if sessions != 1 {
		t.Errorf("CreateSshSession called %d times, want 1", sessions)
	}
}

func TestSSHProxyBridgesStdio(t *testing.T) {
	ff := newForwardFake()
	ep := ff.serve(t)
	tt := newTester(t)
	tokenFile := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tokenFile, []byte("tok-id-box\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("ssh bytes ", 50000)
	tt.stdin = strings.NewReader(payload)
	r := tt.run("--gateway-endpoint", ep, "ssh-proxy", "--sandbox-id", "id-box", "--token-file", tokenFile)
	if r.err != nil {
		t.Fatalf("ssh-proxy: %v (%q)", r.err, r.stderr)
	}
	if r.stdout != payload {
		t.Errorf("ssh-proxy echoed %d bytes, want %d", len(r.stdout), len(payload))
	}
	ff.mu.Lock()
	in := ff.inits[0]
	ff.mu.Unlock()
	if in.GetSsh() == nil || in.GetServiceId() != "ssh-proxy:id-box" {
		t.Errorf("init = %v, want ssh target with service_id ssh-proxy:id-box", in)
	}

	if err := os.WriteFile(tokenFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tt.stdin = strings.NewReader("x")
	r = tt.run("--gateway-endpoint", ep, "ssh-proxy", "--sandbox-id", "id-box", "--token-file", tokenFile)
	if r.err == nil || !strings.Contains(r.err.Error(), "unauthenticated") {
		t.Errorf("ssh-proxy with a bad token = %v", r.err)
	}
}

// fakeSSHServer is a minimal SSH server like the supervisor's: "none"
// authentication for user sandbox; a shell echoes its stdin upper-cased and
// exits with status 3.
func fakeSSHServer(t testing.TB) func(net.Conn) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	return func(c net.Conn) {
		defer c.Close()
		sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		defer sc.Close()
		if sc.User() != "sandbox" {
			return
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			if nc.ChannelType() != "session" {
				_ = nc.Reject(ssh.UnknownChannelType, "no")
				continue
			}
			ch, creqs, err := nc.Accept()
			if err != nil {
				return
			}
			for req := range creqs {
				if req.Type != "shell" {
					_ = req.Reply(req.Type == "pty-req", nil)
					continue
				}
				_ = req.Reply(true, nil)
				b, _ := io.ReadAll(ch)
				fmt.Fprintf(ch, "sandbox got: %s", strings.ToUpper(string(b)))
				status := make([]byte, 4)
				binary.BigEndian.PutUint32(status, 3)
				_, _ = ch.SendRequest("exit-status", false, status)
				ch.Close()
				return
			}
		}
	}
}

func TestConnectRunsShellOverRelay(t *testing.T) {
	ff := newForwardFake()
	ff.sshTarget = fakeSSHServer(t)
	ep := ff.serve(t)
	tt := newTester(t)
	tt.stdin = strings.NewReader("echo hi; exit\n")
	r := tt.run("--gateway-endpoint", ep, "sandbox", "connect", "box")
	if r.code() != 3 {
		t.Errorf("connect exit code = %d, want 3 (err %v, stderr %q)", r.code(), r.err, r.stderr)
	}
	if r.stdout != "sandbox got: ECHO HI; EXIT\n" {
		t.Errorf("connect stdout = %q", r.stdout)
	}
}
