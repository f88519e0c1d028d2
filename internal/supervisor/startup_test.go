package supervisor

import (
	"net"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// currentGC returns the GC percent and memory limit in force.
func currentGC() (int, int64) {
	pct := debug.SetGCPercent(-1)
	debug.SetGCPercent(pct)
	return pct, debug.SetMemoryLimit(-1)
}

// TestDeferGC: collection is off with a memory limit during the start,
// and the operator's GOGC and GOMEMLIMIT come back after, once.
func TestDeferGC(t *testing.T) {
	pct0, limit0 := currentGC()
	t.Cleanup(func() { debug.SetGCPercent(pct0); debug.SetMemoryLimit(limit0) })
	for _, limit := range []int64{1 << 40, 16 << 20} {
		debug.SetGCPercent(77)
		debug.SetMemoryLimit(limit)
		resume := deferGC()
		pct, lim := currentGC()
		if pct != -1 || lim != min(limit, startupMemoryLimit) {
			t.Fatalf("during the start: GC percent %d, limit %d; want -1, %d", pct, lim, min(limit, startupMemoryLimit))
		}
		resume()
		if pct, lim = currentGC(); pct != 77 || lim != limit {
			t.Fatalf("after resume: GC percent %d, limit %d; want 77, %d", pct, lim, limit)
		}
		debug.SetGCPercent(50)
		resume() // a second call changes nothing
		if pct, _ = currentGC(); pct != 50 {
			t.Fatalf("a second resume set GC percent %d", pct)
		}
	}
}

// TestStartupClock: each mark times the step since the previous one.
func TestStartupClock(t *testing.T) {
	c := newStartupClock()
	c.mark("a")
	c.note("b", 1500)
	c.mark("c")
	f := c.fields()
	if len(f) != 8 || f[0] != "a" || f[2] != "b" || f[4] != "c" || f[6] != "total" {
		t.Fatalf("fields = %v", f)
	}
}

// TestSettleConnection: the pivot's wait for the gateway connection ends
// once it is up or has failed, and at the latest at the timeout (a peer
// that accepts but never answers the HTTP/2 preface).
func TestSettleConnection(t *testing.T) {
	dir := t.TempDir()
	dial := func(p string) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient("unix://"+p, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.Connect()
		return conn
	}

	// Nothing listens: failed quickly, gRPC retries later.
	conn := dial(filepath.Join(dir, "missing.sock"))
	start := time.Now()
	settleConnection(conn, 10*time.Second)
	if s := conn.GetState(); s != connectivity.TransientFailure || time.Since(start) > 5*time.Second {
		t.Fatalf("missing socket: state %v after %v", s, time.Since(start))
	}

	// A gRPC server: connected.
	ln, err := net.Listen("unix", filepath.Join(dir, "grpc.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn = dial(filepath.Join(dir, "grpc.sock"))
	settleConnection(conn, 10*time.Second)
	if s := conn.GetState(); s != connectivity.Ready {
		t.Fatalf("gRPC server: state %v", s)
	}

	// A peer that never answers: the timeout bounds the wait.
	silent, err := net.Listen("unix", filepath.Join(dir, "silent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	t.Cleanup(func() {
		silent.Close()
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	})
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	conn = dial(filepath.Join(dir, "silent.sock"))
	start = time.Now()
	settleConnection(conn, 200*time.Millisecond)
	if d := time.Since(start); d < 150*time.Millisecond || d > 5*time.Second {
		t.Fatalf("silent peer: waited %v, want about the 200ms timeout", d)
	}
	if s := conn.GetState(); s != connectivity.Connecting {
		t.Fatalf("silent peer: state %v, want still connecting", s)
	}
}
