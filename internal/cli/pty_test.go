package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/citest"
)

// ptyShell is a fake supervisor SSH server for terminal sessions: it
// records the PTY request and window changes, echoes keystrokes and ends
// the session when it reads "exit\r".
type ptyShell struct {
	mu      sync.Mutex
	term    string
	cols    uint32
	rows    uint32
	resizes [][2]uint32
	input   bytes.Buffer
}

func (p *ptyShell) serve(t testing.TB) func(net.Conn) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
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
		go ssh.DiscardRequests(reqs)
		// Serve the first channel only.
		if nc, ok := <-chans; ok {
			ch, creqs, err := nc.Accept()
			if err != nil {
				return
			}
			var wg sync.WaitGroup
			for req := range creqs {
				switch req.Type {
				case "pty-req":
					var r struct {
						Term             string
						Cols, Rows, W, H uint32
						Modes            string
					}
					_ = ssh.Unmarshal(req.Payload, &r)
					p.mu.Lock()
					p.term, p.cols, p.rows = r.Term, r.Cols, r.Rows
					p.mu.Unlock()
					_ = req.Reply(true, nil)
				case "window-change":
					var r struct{ Cols, Rows, W, H uint32 }
					_ = ssh.Unmarshal(req.Payload, &r)
					p.mu.Lock()
					p.resizes = append(p.resizes, [2]uint32{r.Cols, r.Rows})
					p.mu.Unlock()
				case "shell":
					_ = req.Reply(true, nil)
					wg.Go(func() {
						buf := make([]byte, 256)
						for {
							n, err := ch.Read(buf)
							p.mu.Lock()
							p.input.Write(buf[:n])
							done := strings.Contains(p.input.String(), "exit\r")
							p.mu.Unlock()
							_, _ = ch.Write(buf[:n]) // remote echo
							if done || err != nil {
								_, _ = ch.Write([]byte("\r\nbye\r\n"))
								_, _ = ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, 0))
								ch.Close()
								return
							}
						}
					})
				default:
					_ = req.Reply(false, nil)
				}
			}
			wg.Wait()
		}
	}
}

func TestConnectThroughPTY(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		citest.SkipOrFail(t, "no pty: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 100, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	shell := &ptyShell{}
	ff := newForwardFake()
	ff.sshTarget = shell.serve(t)
	ep := ff.serve(t)

	tt := newTester(t)
	var stderr bytes.Buffer
	a := newApp(tty, tty, &stderr)
	a.getenv = func(k string) string { return tt.env[k] }
	a.lookupEnv = func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
	done := make(chan error, 1)
	go func() { done <- a.run(t.Context(), []string{"--gateway-endpoint", ep, "sandbox", "connect", "box"}) }()

	// The screen: everything the CLI writes to the terminal.
	var screenMu sync.Mutex
	var screen bytes.Buffer
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		_, _ = io.Copy(&lockedWriter{mu: &screenMu, w: &screen}, ptmx)
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				screenMu.Lock()
				defer screenMu.Unlock()
				t.Fatalf("timed out waiting for %s; screen %q, stderr %q", what, screen.String(), stderr.String())
			}
			time.Sleep(10 * time.Millisecond) // polling a fake with a deadline
		}
	}
	waitFor("the shell", func() bool { shell.mu.Lock(); defer shell.mu.Unlock(); return shell.term != "" })
	shell.mu.Lock()
	if shell.term != "xterm-256color" || shell.cols != 100 || shell.rows != 40 {
		t.Errorf("pty-req = %q %dx%d, want xterm-256color 100x40", shell.term, shell.cols, shell.rows)
	}
	shell.mu.Unlock()
	// Raw mode: no canonical processing, so keystrokes go through at once.
	waitFor("raw mode", func() bool {
		tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
		return err == nil && tio.Lflag&unix.ICANON == 0
	})

	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 120, Rows: 50}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	waitFor("window change", func() bool {
		shell.mu.Lock()
		defer shell.mu.Unlock()
		return len(shell.resizes) > 0 && shell.resizes[len(shell.resizes)-1] == [2]uint32{120, 50}
	})

	if _, err := ptmx.Write([]byte("echo hi; exit\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("connect: %v (stderr %q)", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connect did not return after exit")
	}
	waitFor("bye on screen", func() bool { screenMu.Lock(); defer screenMu.Unlock(); return strings.Contains(screen.String(), "bye") })
	screenMu.Lock()
	if !strings.Contains(screen.String(), "echo hi; exit") {
		t.Errorf("screen %q lacks the echoed input", screen.String())
	}
	screenMu.Unlock()
	tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&unix.ICANON == 0 {
		t.Errorf("terminal not restored after connect (lflag %#x, %v)", tio.Lflag, err)
	}
	// connect's stdin pump is still blocked reading the terminal (as it is
	// in the real CLI until the process exits); one more keystroke lets it
	// finish, so that closing both ends ends the screen reader.
	if _, err := ptmx.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	ptmx.Close()
	select {
	case <-readerDone:
	case <-time.After(10 * time.Second):
		t.Fatal("screen reader did not end")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
