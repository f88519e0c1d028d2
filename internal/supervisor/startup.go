package supervisor

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// startupClock times the steps of a supervisor start (logged at debug
// level as "supervisor startup" once the SSH server runs; the gateway
// marks the sandbox READY at the session that follows).
type startupClock struct {
	start, last time.Time
	attrs       []any
}

func newStartupClock() *startupClock {
	now := time.Now()
	return &startupClock{start: now, last: now}
}

// mark records the time since the previous mark as step.
func (c *startupClock) mark(step string) {
	now := time.Now()
	c.attrs = append(c.attrs, step, now.Sub(c.last).Round(time.Microsecond))
	c.last = now
}

// note records d as step, a step that ran alongside the others.
func (c *startupClock) note(step string, d time.Duration) {
	c.attrs = append(c.attrs, step, d.Round(time.Microsecond))
}

// fields are the recorded steps and the total, as slog key-value pairs.
func (c *startupClock) fields() []any {
	return append(c.attrs, "total", c.last.Sub(c.start).Round(time.Microsecond))
}

// gcResumeAfter is how long after its SSH server started the supervisor
// collects again without an accepted session.
const gcResumeAfter = 5 * time.Second

// startupMemoryLimit bounds the heap while deferGC holds collection off.
const startupMemoryLimit = 64 << 20

// deferGC turns the garbage collector off for the start (a few MB of
// short-lived data: CA roots, TLS, protobuf; two or three collections
// on the critical path otherwise), with a memory limit that collects
// anyway past startupMemoryLimit. The returned function restores the
// previous settings (GOGC, GOMEMLIMIT); calling it again does nothing.
func deferGC() (resume func()) {
	limit := debug.SetMemoryLimit(-1)
	pct := debug.SetGCPercent(-1)
	debug.SetMemoryLimit(min(limit, startupMemoryLimit))
	return sync.OnceFunc(func() {
		debug.SetGCPercent(pct)
		debug.SetMemoryLimit(limit)
	})
}

// connectSettleTimeout bounds how long the pivot waits for the gateway
// connection to settle.
const connectSettleTimeout = 2 * time.Second

// settleConnection waits until conn is no longer idle or connecting:
// connected, or failed (then gRPC retries it later), or until timeout.
func settleConnection(conn *grpc.ClientConn, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		s := conn.GetState()
		if s != connectivity.Idle && s != connectivity.Connecting {
			return
		}
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}
