package gateway

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// TestOpenStoreWaiting checks the start-up wait's policy with a fake
// opener under synctest: retries only Unavailable, backs off doubling up
// to dbWaitCap, and gives up at the limit naming it.
func TestOpenStoreWaiting(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	t.Run("gives up at the limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var at []time.Duration
			start := time.Now()
			_, err := openStoreWaiting(t.Context(), log, 20*time.Second, func(context.Context) (store.Store, error) {
				at = append(at, time.Since(start))
				return nil, errdefs.Unavailable("cannot connect")
			})
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still unavailable after waiting 20s") {
				t.Errorf("openStoreWaiting() = %v, want Unavailable naming the 20s limit", err)
			}
			want := []time.Duration{0, 250 * time.Millisecond, 750 * time.Millisecond, 1750 * time.Millisecond, 3750 * time.Millisecond,
				7750 * time.Millisecond, 12750 * time.Millisecond, 17750 * time.Millisecond, 20 * time.Second}
			if len(at) != len(want) {
				t.Fatalf("attempts at %v, want %v", at, want)
			}
			for i := range want {
				if at[i] != want[i] {
					t.Errorf("attempt %d at %v, want %v", i, at[i], want[i])
				}
			}
		})
	})
	t.Run("other errors end at once", func(t *testing.T) {
		n := 0
		_, err := openStoreWaiting(t.Context(), log, time.Minute, func(context.Context) (store.Store, error) {
			n++
			return nil, errdefs.InvalidArgument("bad url")
		})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || n != 1 {
			t.Errorf("openStoreWaiting() = %v after %d attempts, want InvalidArgument after 1", err, n)
		}
	})
	t.Run("zero limit is one attempt", func(t *testing.T) {
		n := 0
		_, err := openStoreWaiting(t.Context(), log, 0, func(context.Context) (store.Store, error) {
			n++
			return nil, errdefs.Unavailable("cannot connect")
		})
		if !errors.Is(err, errdefs.ErrUnavailable) || n != 1 {
			t.Errorf("openStoreWaiting() = %v after %d attempts, want Unavailable after 1", err, n)
		}
	})
}
