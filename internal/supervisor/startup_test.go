package supervisor

import (
	"runtime/debug"
	"testing"
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
