package hostdial

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestDialThroughChannel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hi from "+c.LocalAddr().String())
			c.Close()
		}
	}()
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
	cl, err := NewClient(child)
	if err != nil {
		t.Fatal(err)
	}
	target := netip.MustParseAddrPort(ln.Addr().String())
	for range 3 { // the channel serves many dials
		c, err := cl.Dial(context.Background(), target)
		if err != nil {
			t.Fatal(err)
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
