package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
)

// Readiness probe bounds: each check gets checkTimeout; the driver, whose
// check lists the backend's sandboxes, is asked at most once per
// driverCheckEvery.
const (
	checkTimeout     = 2 * time.Second
	driverCheckEvery = 5 * time.Second
)

// pinger is implemented by stores that can check their database.
type pinger interface {
	Ping(ctx context.Context) error
}

// readiness answers /readyz: the gateway has finished starting, its store
// answers and its compute driver answers.
type readiness struct {
	started    <-chan struct{}
	store      any // checked when it is a pinger
	driver     compute.Driver
	driverName string
	log        *slog.Logger
	now        func() time.Time

	mu          sync.Mutex
	driverAt    time.Time
	driverErr   error
	driverValid bool
}

// status is the Health RPC's view: DEGRADED while not ready, so a client
// tells "gateway up, database (or driver) unavailable" from "gateway
// unreachable".
func (r *readiness) status(ctx context.Context) openshellv1.ServiceStatus {
	if r.check(ctx) != nil {
		return openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED
	}
	return openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY
}

// check reports why the gateway is not ready, or nil. The reasons carry
// no connection details (the store's errors are "database unavailable";
// a driver's error is logged, not returned).
func (r *readiness) check(ctx context.Context) error {
	select {
	case <-r.started:
	default:
		return errors.New("starting")
	}
	var errs []error
	if p, ok := r.store.(pinger); ok {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		err := p.Ping(cctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("store: %w", err))
		}
	}
	if err := r.checkDriver(ctx); err != nil {
		errs = append(errs, fmt.Errorf("compute driver %s: %w", r.driverName, err))
	}
	return errors.Join(errs...)
}

func (r *readiness) checkDriver(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.driverValid && now.Sub(r.driverAt) < driverCheckEvery {
		return r.driverErr
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	_, err := r.driver.List(cctx)
	if err != nil {
		r.log.Warn("readiness: compute driver not answering", "driver", r.driverName, "err", err)
		err = errors.New("not answering")
	}
	r.driverAt, r.driverErr, r.driverValid = now, err, true
	return err
}
