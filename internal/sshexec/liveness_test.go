package sshexec

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// testLiveness keeps the liveness tests fast.
var testLiveness = Liveness{KeepaliveInterval: 50 * time.Millisecond, KeepaliveTimeout: 200 * time.Millisecond, CloseWait: 200 * time.Millisecond}

// scriptedServer is a real x/crypto/ssh server whose exec requests run
// scripted behaviours instead of commands:
//
//	quiet   silent for 10 keepalive intervals, then "done\n", exit 0
//	hang    nothing, ever (a wedged command)
//	linger  exit status 3, then the channel is never closed
type scriptedServer struct {
	ln      net.Listener
	config  *ssh.ServerConfig
	started chan string // receives each exec's command once started
	wg      sync.WaitGroup
	stop    chan struct{}
}

func startScriptedServer(t *testing.T) *scriptedServer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedServer{ln: ln, config: cfg, started: make(chan string, 8), stop: make(chan struct{})}
	s.wg.Go(s.accept)
	t.Cleanup(func() { close(s.stop); ln.Close(); s.wg.Wait() })
	return s
}

func (s *scriptedServer) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer c.Close()
			go func() { <-s.stop; c.Close() }()
			_, chans, reqs, err := ssh.NewServerConn(c, s.config)
			if err != nil {
				return
			}
			go ssh.DiscardRequests(reqs) // answers keepalives (with false, as OpenSSH)
			for nc := range chans {
				ch, creqs, err := nc.Accept()
				if err != nil {
					return
				}
				s.wg.Go(func() { s.session(ch, creqs) })
			}
		})
	}
}

func (s *scriptedServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for r := range reqs {
		if r.Type != "exec" {
			_ = r.Reply(r.Type == "env" || r.Type == "pty-req", nil)
			continue
		}
		var m execMsg
		_ = ssh.Unmarshal(r.Payload, &m)
		_ = r.Reply(true, nil)
		s.started <- m.Command
		status := func(code uint32) {
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(&struct{ C uint32 }{code}))
		}
		switch m.Command {
		case "quiet":
			select {
			case <-time.After(10 * testLiveness.KeepaliveInterval):
			case <-s.stop:
				return
			}
			_, _ = io.WriteString(ch, "done\n")
			status(0)
			return
		case "hang", "linger":
			if m.Command == "linger" {
				status(3)
			}
			// Keep the channel open and drain requests until the test ends.
			go func() {
				for r := range reqs {
					if r.WantReply {
						_ = r.Reply(false, nil)
					}
				}
			}()
			<-s.stop
			return
		}
	}
}

// freezingRelay forwards bytes between a client and the server until it
// is frozen: then it keeps both connections open and forwards nothing, as
// a wedged or orphaned relay does.
type freezingRelay struct {
	mu     sync.Mutex
	frozen bool
	thaw   chan struct{}
}

func (f *freezingRelay) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen = true
}

func (f *freezingRelay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			frozen := f.frozen
			f.mu.Unlock()
			if frozen {
				<-f.thaw // until the test ends
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dialThroughRelay returns a client connection to s through a relay.
func dialThroughRelay(t *testing.T, s *scriptedServer) (net.Conn, *freezingRelay) {
	t.Helper()
	server, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client, relayEnd := net.Pipe()
	f := &freezingRelay{thaw: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { f.pipe(server, relayEnd) })
	wg.Go(func() { f.pipe(relayEnd, server) })
	t.Cleanup(func() { close(f.thaw); server.Close(); relayEnd.Close(); wg.Wait() })
	return client, f
}

type execResult struct {
	code int
	err  error
}

func execAsync(t *testing.T, conn net.Conn, cmd string, stdout io.Writer) <-chan execResult {
	t.Helper()
	res := make(chan execResult, 1)
	go func() {
		code, err := ExecWith(t.Context(), conn, Request{Command: []string{cmd}, Stdout: stdout}, testLiveness)
		res <- execResult{code, err}
	}()
	return res
}

func waitResult(t *testing.T, res <-chan execResult, within time.Duration) execResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(within):
		t.Fatalf("exec still running after %s", within)
		return execResult{}
	}
}

// TestWedgedRelayEndsExecOnUnansweredKeepalive: the relay stops
// forwarding while a command runs; the unanswered keepalive closes the
// connection and the exec returns Unavailable instead of hanging.
func TestWedgedRelayEndsExecOnUnansweredKeepalive(t *testing.T) {
	s := startScriptedServer(t)
	conn, relay := dialThroughRelay(t, s)
	res := execAsync(t, conn, "hang", nil)
	if got := <-s.started; got != "hang" {
		t.Fatalf("server started %q, want hang", got)
	}
	relay.freeze()
	r := waitResult(t, res, 10*time.Second)
	if !errors.Is(r.err, errdefs.ErrUnavailable) || !strings.Contains(r.err.Error(), "keepalive") {
		t.Errorf("Exec over a wedged relay = %d, %v; want Unavailable naming the keepalive", r.code, r.err)
	}
}

// TestIdleOutputDoesNotEndExec: a command silent for many keepalive
// intervals on a healthy relay runs to its end.
func TestIdleOutputDoesNotEndExec(t *testing.T) {
	s := startScriptedServer(t)
	conn, _ := dialThroughRelay(t, s)
	var out bytes.Buffer
	r := waitResult(t, execAsync(t, conn, "quiet", &out), 10*time.Second)
	if r.err != nil || r.code != 0 || out.String() != "done\n" {
		t.Errorf("Exec(quiet) = %d, %v, output %q; want 0, nil, %q", r.code, r.err, out.String(), "done\n")
	}
}

// TestTrailingCloseWaitIsBounded: the server sends the exit status but
// never closes the channel; the exec returns the status after CloseWait.
func TestTrailingCloseWaitIsBounded(t *testing.T) {
	s := startScriptedServer(t)
	conn, _ := dialThroughRelay(t, s)
	start := time.Now()
	r := waitResult(t, execAsync(t, conn, "linger", nil), 10*time.Second)
	if r.err != nil || r.code != 3 {
		t.Errorf("Exec(linger) = %d, %v; want 3, nil", r.code, r.err)
	}
	if d := time.Since(start); d < testLiveness.CloseWait {
		t.Errorf("Exec(linger) returned after %s, before the %s close wait", d, testLiveness.CloseWait)
	}
}
