package lifecycle

import (
	"context"
	"errors"
	"sync"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// gate serializes every change to one sandbox's row and to the engine's
// view of it (backend snapshot, supervisor session). Holders are the
// lifecycle operations (create, adopt, delete, stop, start, recovery);
// observations (driver events, session changes, reports from the
// supervisor) are posted to the gate and run by whoever holds it, before
// it is released, so that they never wait for a long operation such as a
// driver stop.
type gate struct {
	mu    sync.Mutex
	refs  int                               // holders and waiters; at zero the gate leaves Engine.gates
	queue []func(ctx context.Context) error // posted work, run by the holder before it lets go
}

// sandboxState is what the engine knows about a sandbox besides its row.
// Entries exist only for sandboxes whose row exists; they are created and
// removed under the sandbox's gate.
type sandboxState struct {
	backend   backendView
	connected bool
	instance  string // the connected supervisor's instance id
}

// lock takes id's gate, waiting for the current holder.
func (e *Engine) lock(id string) *gate {
	e.gateMu.Lock()
	g := e.gates[id]
	if g == nil {
		g = &gate{}
		e.gates[id] = g
	}
	g.refs++
	e.gateMu.Unlock()
	g.mu.Lock()
	return g
}

// unlock runs the work posted while the gate was held, then releases it.
// The last user removes the gate, so the map only holds sandboxes that
// someone is working on.
func (e *Engine) unlock(ctx context.Context, id string, g *gate) {
	ctx = context.WithoutCancel(ctx)
	for {
		e.gateMu.Lock()
		work := g.queue
		g.queue = nil
		if len(work) == 0 {
			g.refs--
			if g.refs == 0 {
				delete(e.gates, id)
			}
			g.mu.Unlock()
			e.gateMu.Unlock()
			return
		}
		e.gateMu.Unlock()
		for _, w := range work {
			if err := w(ctx); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				e.log.Warn("apply posted sandbox change", "sandbox_id", id, "err", err)
			}
		}
	}
}

// post runs fn under id's gate without waiting for it: when the gate is
// free, fn runs now and post returns its error; when someone holds or
// awaits the gate, fn is queued for the holder to run before it lets go,
// and post returns nil at once.
func (e *Engine) post(ctx context.Context, id string, fn func(ctx context.Context) error) error {
	e.gateMu.Lock()
	if g := e.gates[id]; g != nil {
		g.queue = append(g.queue, fn)
		e.gateMu.Unlock()
		return nil
	}
	g := &gate{refs: 1}
	g.mu.Lock() // a new gate: uncontended
	e.gates[id] = g
	e.gateMu.Unlock()
	err := fn(ctx)
	e.unlock(ctx, id, g)
	return err
}

// state returns a copy of what the engine knows about id.
func (e *Engine) state(id string) (sandboxState, bool) {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	st, ok := e.states[id]
	if !ok {
		return sandboxState{}, false
	}
	return *st, true
}

// track starts tracking id, whose row exists. Call under id's gate.
func (e *Engine) track(id string) {
	e.stateMu.Lock()
	if e.states[id] == nil {
		e.states[id] = &sandboxState{}
	}
	e.stateMu.Unlock()
}

// forget stops tracking id, whose row is gone. Call under id's gate.
func (e *Engine) forget(id string) {
	e.stateMu.Lock()
	delete(e.states, id)
	e.stateMu.Unlock()
}

// known reports whether id's row exists, tracking it when it does (a
// sandbox another replica created, or one this engine has not seen since
// it started). Call under id's gate.
func (e *Engine) known(ctx context.Context, id string) (bool, error) {
	if _, ok := e.state(id); ok {
		return true, nil
	}
	_, err := e.store.GetSandbox(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	e.track(id)
	return true, nil
}

// update changes the tracked state of id, if tracked. Call under id's gate.
func (e *Engine) update(id string, fn func(*sandboxState)) {
	e.stateMu.Lock()
	if st := e.states[id]; st != nil {
		fn(st)
	}
	e.stateMu.Unlock()
}

func (e *Engine) setBackend(id string, b backendView) {
	e.update(id, func(st *sandboxState) { st.backend = b })
}
