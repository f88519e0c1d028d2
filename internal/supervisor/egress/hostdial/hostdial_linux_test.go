package hostdial

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDialThroughChannel(t *testing.T) {
	ln := loopbackServer(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "hi from "+c.LocalAddr().String())
		c.Close()
	})
	serve, child, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	refused := netip.MustParseAddrPort("127.0.0.1:1")
	done := make(chan error, 1)
	go func() {
		done <- Serve(serve, 5*time.Second, func(a netip.AddrPort) error {
			if a == refused {
				return errors.New("refused by the host side")
			}
			return nil
		})
	}()
	cl, err := NewClient(child, nil)
	if err != nil {
		t.Fatal(err)
	}
	target := netip.MustParseAddrPort(ln.Addr().String())
	for range 3 { // the channel serves many dials
		c, err := cl.Dial(context.Background(), target)
		if err != nil {
			t.Fatal(err)
		}
		// The proxy's tunnels splice only between *net.TCPConn.
		if _, ok := c.(*net.TCPConn); !ok {
			t.Fatalf("Dial returned a %T, want a *net.TCPConn (a wrapper makes the proxy copy through user space)", c)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		if string(b) != "hi from "+target.String() {
			t.Fatalf("read %q", b)
		}
	}
	if _, err := cl.Dial(context.Background(), refused); err == nil || !strings.Contains(err.Error(), "refused by the host side") {
		t.Errorf("refused address: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cl.Dial(ctx, target); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled dial: %v", err)
	}
	// The supervisor's end closing ends Serve.
	cl.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end after the client closed")
	}
	if _, err := cl.Dial(context.Background(), target); err == nil {
		t.Error("dial after close succeeded")
	}
}

// TestRedialAfterDriverExit: the inherited channel's driver end closes
// (the gateway exited); the next dial reconnects through the listening
// socket of the next driver, which accepts only its supervisor's uid.
func TestRedialAfterDriverExit(t *testing.T) {
	up := loopbackServer(t, func(c net.Conn) {
		_, _ = c.Write([]byte("up"))
		c.Close()
	})
	target := netip.MustParseAddrPort(up.Addr().String())
	serve, child, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	redial := func() (*net.UnixConn, error) { return DialSocket(dir + "/dialer.sock") }
	cl, err := NewClient(child, redial)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	read := func() (string, error) {
		c, err := cl.Dial(context.Background(), target)
		if err != nil {
			return "", err
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		return string(b), err
	}
	served := make(chan error, 1)
	go func() { served <- Serve(serve, 5*time.Second, nil) }()
	if got, err := read(); err != nil || got != "up" {
		t.Fatalf("dial over the inherited channel = %q, %v", got, err)
	}
	serve.Close() // the driver's process ended
	<-served
	if _, err := read(); err == nil || !strings.Contains(err.Error(), "reconnect") {
		t.Fatalf("dial with no driver serving = %v, want the reconnect failure", err)
	}
	// A listener for another uid refuses the connection.
	other, err := Listen(dir, "dialer.sock", os.Getuid()+1, os.Getgid(), 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(); err == nil {
		t.Fatalf("dial through a listener for another uid = %q, want a failure", got)
	}
	other.Close()
	l, err := Listen(dir, "dialer.sock", os.Getuid(), os.Getgid(), 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Stat(dir + "/dialer.sock")
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dialer socket mode = %v, %v, want 0600", fi, err)
	}
	if got, err := read(); err != nil || got != "up" {
		t.Fatalf("dial after the driver came back = %q, %v", got, err)
	}
}

// loopbackServer listens on a loopback port, hands every accepted
// connection to handle (on the accept goroutine) and closes the listener
// when the test ends.
func loopbackServer(t testing.TB, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	return ln
}
