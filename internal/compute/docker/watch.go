package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// watchBuffer is how many events a watcher may lag behind before its watch
// ends with Unavailable (the gateway then lists and watches again).
const watchBuffer = 1024

// subscriber receives the driver's own events (pulls, pending sandboxes).
type subscriber struct {
	ch   chan compute.Event
	dead chan struct{} // closed when the driver drops the subscriber
	err  error         // why; set before dead is closed
}

// emitLocked delivers ev to every subscriber without blocking. d.mu must
// be held.
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

// Watch implements compute.Driver. The stream starts with one sandbox
// event per sandbox (the current snapshot), then follows the Docker
// Engine's container events for this gateway's containers (each one read
// back with an inspect) and the driver's pull events. It ends with
// Unavailable when the Engine's event stream breaks.
func (d *Driver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, nil, errdefs.Unavailable("docker driver is closed")
	}
	s := &subscriber{ch: make(chan compute.Event, watchBuffer), dead: make(chan struct{})}
	d.subs[s] = struct{}{}
	d.mu.Unlock()
	drop := func() {
		d.mu.Lock()
		delete(d.subs, s)
		d.mu.Unlock()
	}

	wctx, cancel := context.WithCancel(ctx)
	now := time.Now()
	msgs, errs := d.cli.Events(wctx, events.ListOptions{
		// Replayed from the subscription's start: nothing between the
		// request and the daemon registering it is lost.
		Since: fmt.Sprintf("%d.%09d", now.Unix(), now.Nanosecond()),
		Filters: filters.NewArgs(
			filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("label", LabelGatewayID+"="+d.gatewayID),
		),
	})
	snapshot, err := d.List(ctx)
	if err != nil {
		cancel()
		drop()
		return nil, nil, err
	}
	out := make(chan compute.Event, watchBuffer)
	var finalErr error
	done := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(done)
		defer close(out)
		defer drop()
		defer cancel()
		finalErr = d.pump(wctx, ctx, s, snapshot, msgs, errs, out)
	}()
	return out, func() error {
		<-done
		return finalErr
	}, nil
}

// pump forwards events to out until parent ends (nil) or a source fails.
func (d *Driver) pump(ctx, parent context.Context, s *subscriber, snapshot []compute.Sandbox,
	msgs <-chan events.Message, errs <-chan error, out chan<- compute.Event) error {
	send := func(ev compute.Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	ended := func() error {
		if canceled(parent) {
			return nil
		}
		return errdefs.Unavailable("docker driver is closed")
	}
	for _, sb := range snapshot {
		if !send(compute.Event{Kind: compute.EventSandbox, SandboxID: sb.ID, Sandbox: sb}) {
			return ended()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ended()
		case <-d.done:
			return errdefs.Unavailable("docker driver is closed")
		case <-s.dead:
			return s.err
		case ev := <-s.ch:
			if !send(ev) {
				return ended()
			}
		case err := <-errs:
			if canceled(parent) {
				return nil
			}
			if err == nil || errors.Is(err, context.Canceled) {
				err = errors.New("stream closed")
			}
			return errdefs.Unavailable(fmt.Sprintf("docker driver: Docker Engine event stream ended: %v", err))
		case m := <-msgs:
			ev, ok := d.translate(ctx, m)
			if ok && !send(ev) {
				return ended()
			}
		}
	}
}

// translate turns one Engine container event into a driver event.
func (d *Driver) translate(ctx context.Context, m events.Message) (compute.Event, bool) {
	id := m.Actor.Attributes[LabelSandboxID]
	if id == "" {
		return compute.Event{}, false
	}
	switch m.Action {
	case events.ActionDestroy:
		return compute.Event{Kind: compute.EventDeleted, SandboxID: id}, true
	case events.ActionCreate, events.ActionStart, events.ActionDie, events.ActionStop, events.ActionKill,
		events.ActionPause, events.ActionUnPause, events.ActionRestart, events.ActionOOM:
	default:
		return compute.Event{}, false
	}
	sb, err := d.inspect(ctx, m.Actor.ID)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil {
			d.logger.Warn("inspect container after event", "sandbox_id", id, "action", m.Action, "error", err)
		}
		return compute.Event{}, false
	}
	return compute.Event{Kind: compute.EventSandbox, SandboxID: id, Sandbox: sb}, true
}

// canceled reports whether the watch's caller ended it.
func canceled(ctx context.Context) bool { return ctx.Err() != nil }
