package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReconnectLoopBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		var at []time.Duration
		// Attempts 1-4 fail, 5 is accepted, 6-7 fail, then stop.
		attempt := func(ctx context.Context) (bool, error) {
			at = append(at, time.Since(start))
			n := len(at)
			if n == 7 {
				cancel()
			}
			return n == 5, errors.New("gateway unavailable")
		}
		reconnectLoop(ctx, slog.New(slog.DiscardHandler), newBackoff(time.Second, 4*time.Second), sleepCtx, attempt)
		s := time.Second
		// waits: 1,2,4,4 (cap), then reset after acceptance: 1, 2
		want := []time.Duration{0, 1 * s, 3 * s, 7 * s, 11 * s, 12 * s, 14 * s}
		if diff := cmp.Diff(want, at); diff != "" {
			t.Errorf("attempt times (-want +got):\n%s", diff)
		}
	})
}

func TestReconnectLoopStopsOnCancelDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		attempts := 0
		go func() {
			defer close(done)
			reconnectLoop(ctx, slog.New(slog.DiscardHandler), newBackoff(time.Minute, time.Hour), sleepCtx, func(context.Context) (bool, error) {
				attempts++
				return false, errors.New("down")
			})
		}()
		synctest.Wait() // the loop is now sleeping its first backoff
		cancel()
		<-done
		if attempts != 1 {
			t.Errorf("attempts = %d, want 1", attempts)
		}
	})
}

func TestRefreshAt(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		iat, exp time.Time
		want     time.Time
	}{
		{"never expires", time.Unix(900, 0), time.Time{}, time.Time{}},
		{"80 percent", time.Unix(1000, 0), time.Unix(2000, 0), time.Unix(1800, 0)},
		{"no iat uses now", time.Time{}, time.Unix(1100, 0), time.Unix(1080, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := refreshAt(now, tt.iat, tt.exp); !got.Equal(tt.want) {
				t.Errorf("refreshAt(%v, %v) = %v, want %v", tt.iat, tt.exp, got, tt.want)
			}
		})
	}
}

func TestLogPusherDropsOldest(t *testing.T) {
	p := newLogPusher(nil, "sb", 3)
	for _, m := range []string{"a", "b", "c", "d", "e"} {
		p.add(processLine("stdout", m))
	}
	var got []string
	for _, l := range p.take() {
		got = append(got, l.GetMessage())
	}
	want := []string{"dropped 2 log lines: gateway too slow", "c", "d", "e"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("take() (-want +got):\n%s", diff)
	}
}
