package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// Recover brings store and backend back in line after a restart (including
// a kill -9 in the middle of a create or delete):
//   - a backend workload without a row is an orphan: deleted;
//   - a PROVISIONING row without a backend is a create that never finished:
//     the row is removed (the create call never succeeded);
//   - DELETING rows finish their delete; STOPPING/STARTING rows retry;
//   - with gateway_manages_lifecycle, sandboxes that were running when the
//     gateway stopped are started again (explicitly STOPPED ones are not).
func (e *Engine) Recover(ctx context.Context) (err error) {
	ctx, end := telemetry.StartOperation(ctx, "lifecycle.Recover")
	defer func() { end(err) }()
	backends, err := e.driver.List(ctx)
	if err != nil {
		return fmt.Errorf("list backend sandboxes: %w", err)
	}
	byID := map[string]compute.Sandbox{}
	for _, b := range backends {
		byID[b.ID] = b
	}
	rows, err := e.allRows(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, sb := range rows {
		id := sb.GetMetadata().GetId()
		known[id] = true
		b, present := byID[id]
		g := e.lock(id)
		e.recoverOne(ctx, sb, backendView{present: present, sb: b})
		e.unlock(ctx, id, g)
	}
	for _, b := range backends {
		if known[b.ID] {
			continue
		}
		e.log.Warn("recover: deleting orphan backend sandbox", "sandbox_id", b.ID, "name", b.Name)
		if _, err := e.driver.Delete(ctx, compute.Ref{ID: b.ID, Name: b.Name}); err != nil {
			e.log.Warn("recover: delete orphan", "sandbox_id", b.ID, "err", err)
		}
	}
	return nil
}

// recoverOne brings one row in line with its backend. Call under the
// sandbox's gate.
func (e *Engine) recoverOne(ctx context.Context, sb *openshellv1.Sandbox, b backendView) {
	id := sb.GetMetadata().GetId()
	e.track(id)
	e.setBackend(id, b)
	switch sb.GetStatus().GetPhase() {
	case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
		if err := e.finishDelete(ctx, sb); err != nil {
			e.log.Warn("recover: finish delete", "sandbox_id", id, "err", err)
		}
		return
	case openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING:
		if !b.present {
			e.log.Warn("recover: removing sandbox whose create never finished", "sandbox_id", id)
			e.removeRow(ctx, id, func(sb *openshellv1.Sandbox) bool {
				return sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING
			})
			return
		}
		e.restartIfManaged(ctx, sb, b.sb)
	case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING:
		if err := e.driver.Stop(ctx, compute.Ref{ID: id, Name: sb.GetMetadata().GetName()}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("recover: stop", "sandbox_id", id, "err", err)
		}
		e.refreshBackend(ctx, sb)
	case openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING:
		if err := e.driver.Start(ctx, compute.Ref{ID: id, Name: sb.GetMetadata().GetName()}); err != nil {
			e.log.Warn("recover: start", "sandbox_id", id, "err", err)
		}
		e.refreshBackend(ctx, sb)
	case openshellv1.SandboxPhase_SANDBOX_PHASE_READY:
		if b.present {
			e.restartIfManaged(ctx, sb, b.sb)
		}
	}
	if _, err := e.recompose(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		e.log.Warn("recover: compose", "sandbox_id", id, "err", err)
	}
}

// restartIfManaged starts a sandbox the gateway stopped on its way down.
func (e *Engine) restartIfManaged(ctx context.Context, sb *openshellv1.Sandbox, b compute.Sandbox) {
	if !e.manages || backendRunning(b) {
		return
	}
	if _, terminal := (backendView{present: true, sb: b}).terminal(); terminal {
		return
	}
	if err := e.driver.Start(ctx, compute.Ref{ID: sb.GetMetadata().GetId(), Name: sb.GetMetadata().GetName()}); err != nil {
		e.log.Warn("recover: restart sandbox stopped with the gateway", "sandbox_id", sb.GetMetadata().GetId(), "err", err)
	}
	e.refreshBackend(ctx, sb)
}

func backendRunning(b compute.Sandbox) bool {
	v := backendView{present: true, sb: b}
	return v.ready() || (!v.suspended() && !func() bool { _, t := v.terminal(); return t }())
}

func (e *Engine) allRows(ctx context.Context) ([]*openshellv1.Sandbox, error) {
	var out []*openshellv1.Sandbox
	for offset := 0; ; offset += 1000 {
		page, err := e.store.ListSandboxes(ctx, ListOptions{AllWorkspaces: true, Limit: 1000, Offset: offset})
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, page...)
		if len(page) < 1000 {
			return out, nil
		}
	}
}

// Run watches the driver and reconciles its events into the store until
// ctx ends. A failed watch is re-established with capped backoff.
func (e *Engine) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		events, wait, err := e.driver.Watch(ctx)
		if err == nil {
			backoff = 100 * time.Millisecond
			for ev := range events {
				e.apply(ctx, ev)
			}
			err = wait()
		}
		if ctx.Err() != nil {
			return nil //nolint:nilerr // shutdown: the watch ended because ctx did
		}
		e.log.Warn("driver watch ended; retrying", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// apply reconciles one driver event. It goes through the sandbox's gate
// without waiting for it (see post): the watcher is never held up by one
// sandbox's long operation, and an event for a sandbox without a row
// changes nothing and is not remembered.
func (e *Engine) apply(ctx context.Context, ev compute.Event) {
	ctx, end := telemetry.StartOperation(ctx, "lifecycle.WatchEvent")
	defer end(nil)
	var id string
	var work func(ctx context.Context) error
	switch ev.Kind {
	case compute.EventSandbox:
		id = ev.Sandbox.ID
		snap := ev.Sandbox
		work = func(ctx context.Context) error {
			return e.observe(ctx, id, func(st *sandboxState) { st.backend = backendView{present: true, sb: snap} })
		}
	case compute.EventDeleted:
		id = ev.SandboxID
		work = func(ctx context.Context) error { return e.backendGone(ctx, id) }
	case compute.EventPlatform:
		id = ev.SandboxID
		p := ev.Platform
		work = func(ctx context.Context) error {
			if ok, err := e.known(ctx, id); err != nil || !ok {
				return err
			}
			e.hub.publish(id, Update{Platform: &openshellv1.PlatformEvent{
				TimestampMs: p.Time.UnixMilli(), Source: p.Source, Type: p.Type, Reason: p.Reason, Message: p.Message, Metadata: p.Metadata,
			}})
			return nil
		}
	default:
		return
	}
	if err := e.post(ctx, id, work); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		e.log.Warn("reconcile sandbox event", "sandbox_id", id, "err", err)
	}
}

// backendGone handles the disappearance of a sandbox's backend: a DELETING
// row is removed, any other one composed again. Call under id's gate.
func (e *Engine) backendGone(ctx context.Context, id string) error {
	ok, err := e.known(ctx, id)
	if err != nil || !ok {
		return err
	}
	e.setBackend(id, backendView{})
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if isDeleting(sb) {
		e.removeRow(ctx, id, isDeleting)
		return nil
	}
	_, err = e.recompose(ctx, id)
	return err
}

// StopManaged stops every running sandbox without recording a STOPPED
// intent, for drivers whose sandboxes the gateway owns across restarts.
func (e *Engine) StopManaged(ctx context.Context) {
	if !e.manages {
		return
	}
	rows, err := e.allRows(ctx)
	if err != nil {
		e.log.Warn("stop managed sandboxes", "err", err)
		return
	}
	for _, sb := range rows {
		switch sb.GetStatus().GetPhase() {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			continue
		}
		if err := e.driver.Stop(ctx, compute.Ref{ID: sb.GetMetadata().GetId(), Name: sb.GetMetadata().GetName()}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("stop managed sandbox", "sandbox_id", sb.GetMetadata().GetId(), "err", err)
		}
	}
}
