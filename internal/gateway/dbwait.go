package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// Backoff of the start-up wait for the database.
const (
	dbWaitFirst = 250 * time.Millisecond
	dbWaitCap   = 5 * time.Second
)

// openStoreWaiting calls open until it succeeds, fails with an error other
// than errdefs.ErrUnavailable, or limit has passed since the first
// attempt. Between attempts it waits with doubling backoff capped at
// dbWaitCap and logs why. limit 0 means one attempt.
func openStoreWaiting(ctx context.Context, log *slog.Logger, limit time.Duration, open func(context.Context) (store.Store, error)) (store.Store, error) {
	start := time.Now()
	delay := dbWaitFirst
	for attempt := 1; ; attempt++ {
		st, err := open(ctx)
		if err == nil {
			if attempt > 1 {
				log.Info("database reachable", "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return st, nil
		}
		waited := time.Since(start)
		if !errors.Is(err, errdefs.ErrUnavailable) || limit <= 0 {
			return nil, err
		}
		if waited >= limit {
			return nil, fmt.Errorf("database still unavailable after waiting %s (--database-wait-secs): %w", limit, err)
		}
		delay = min(delay, limit-waited)
		log.Warn("database unavailable; waiting before start-up continues", "err", err, "attempt", attempt,
			"retry_in", delay, "waited", waited.Round(time.Millisecond), "limit", limit)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for the database: %w", ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, dbWaitCap)
	}
}
