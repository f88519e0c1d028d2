//go:build linux

package process

import (
	"context"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// watchBuffer is how many events a watcher may lag behind before its watch
// ends with Unavailable (the gateway then re-lists and watches again).
const watchBuffer = 1024

type subscriber struct {
	ch   chan compute.Event
	dead chan struct{} // closed when the driver drops the subscriber
	err  error         // why; set before dead is closed
}

// Watch implements compute.Driver. The stream starts with one sandbox
// event per known sandbox (the current snapshot), then follows changes.
func (d *Driver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, errdefs.Unavailable("process driver is closed")
	}
	s := &subscriber{ch: make(chan compute.Event, watchBuffer+len(d.sandboxes)), dead: make(chan struct{})}
	for _, sb := range d.sandboxes {
		if !sb.creating {
			s.ch <- d.sandboxEventLocked(sb)
		}
	}
	d.subs[s] = struct{}{}
	var finalErr error
	done := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case <-ctx.Done():
		case <-s.dead:
		case <-d.done:
		}
		d.mu.Lock()
		delete(d.subs, s)
		select {
		case <-s.dead:
			finalErr = s.err
		default:
			if ctx.Err() == nil {
				finalErr = errdefs.Unavailable("process driver is closed")
			}
		}
		close(s.ch)
		d.mu.Unlock()
		close(done)
	}()
	return s.ch, func() error {
		<-done
		return finalErr
	}, nil
}

// emitLocked delivers ev to every watcher without blocking. d.mu must be
// held.
func (d *Driver) emitLocked(ev compute.Event) {
	for s := range d.subs {
		select {
		case s.ch <- ev:
		default:
			delete(d.subs, s)
			s.err = errdefs.Unavailable("watch fell behind; watch again")
			close(s.dead)
		}
	}
}
