package inference

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

// DefaultPollInterval is how often Poll asks the gateway for the bundle.
const DefaultPollInterval = 5 * time.Second

// Fetch reads the sandbox's inference bundle (GetInferenceBundle).
type Fetch func(ctx context.Context) (*inferencev1.GetInferenceBundleResponse, error)

// Refresh fetches the bundle once and installs it when its revision
// differs from the installed one. A gateway answering NotFound or
// Unimplemented (no inference service) installs an empty bundle; other
// errors keep the installed bundle and are returned.
func (r *Router) Refresh(ctx context.Context, fetch Fetch) error {
	b, err := fetch(ctx)
	switch status.Code(err) {
	case codes.OK:
	case codes.NotFound, codes.Unimplemented:
		b = &inferencev1.GetInferenceBundleResponse{}
	default:
		return err
	}
	if b.GetRevision() == r.Revision() {
		return nil
	}
	r.Set(b)
	r.log.Info("inference routes updated", "revision", b.GetRevision(), "routes", len(r.bundle.Load().routes))
	return nil
}

// Poll refreshes the bundle every interval until ctx ends. Failures are
// logged once until the next success; the installed routes stay in force
// meanwhile.
func (r *Router) Poll(ctx context.Context, fetch Fetch, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		err := r.Refresh(ctx, fetch)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			r.log.Warn("cannot refresh the inference bundle; keeping the installed routes", "err", err)
			failing = true
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
