package identity

import (
	"fmt"
	"testing"
	"time"
)

// TestMintLimiter: max requests per sandbox per fixed window, a new window
// after it ends, sandboxes counted apart, expired windows pruned once
// many sandboxes are tracked.
func TestMintLimiter(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := newMintLimiter(time.Minute, 2, func() time.Time { return now })
	for i, want := range []bool{true, true, false} {
		if got := l.allow("a"); got != want {
			t.Errorf("allow(a) #%d = %v, want %v", i+1, got, want)
		}
	}
	if !l.allow("b") {
		t.Error("allow(b) = false, want true: sandboxes are counted apart")
	}
	now = now.Add(59 * time.Second)
	if l.allow("a") {
		t.Error("allow(a) within the window = true, want false")
	}
	now = now.Add(time.Second)
	if !l.allow("a") {
		t.Error("allow(a) once the window ended = false, want true")
	}
	for i := range pruneAbove {
		l.allow(fmt.Sprint("s", i))
	}
	now = now.Add(time.Minute)
	l.allow("fresh")
	if n := len(l.windows); n != 1 {
		t.Errorf("%d windows tracked after pruning, want 1", n)
	}
}
