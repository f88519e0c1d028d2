package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Recover brings store and backend back in line after a restart (including
// a kill -9 in the middle of a create or delete):
//   - a backend workload without a row is an orphan: deleted;
//   - a PROVISIONING row without a backend is a create that never finished:
//     the row is removed (the create call never succeeded);
//   - DELETING rows finish their delete; STOPPING/STARTING rows retry;
//   - with gateway_manages_lifecycle, sandboxes that were running when the
//     gateway stopped are started again (explicitly STOPPED ones are not).
func (e *Engine) Recover(ctx context.Context) error {
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
		e.setBackend(id, backendView{present: present, sb: b})
		switch sb.GetStatus().GetPhase() {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			if err := e.finishDelete(ctx, sb); err != nil {
				e.log.Warn("recover: finish delete", "sandbox_id", id, "err", err)
			}
			continue
		case openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING:
			if !present {
				e.log.Warn("recover: removing sandbox whose create never finished", "sandbox_id", id)
				e.removeRow(ctx, id)
				continue
			}
			e.restartIfManaged(ctx, sb, b)
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
			if present {
				e.restartIfManaged(ctx, sb, b)
			}
		}
		if _, err := e.recompose(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("recover: compose", "sandbox_id", id, "err", err)
		}
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

func (e *Engine) apply(ctx context.Context, ev compute.Event) {
	switch ev.Kind {
	case compute.EventSandbox:
		id := ev.Sandbox.ID
		e.setBackend(id, backendView{present: true, sb: ev.Sandbox})
		unlock := e.gate(id)
		_, err := e.recompose(ctx, id)
		unlock()
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("reconcile sandbox event", "sandbox_id", id, "err", err)
		}
	case compute.EventDeleted:
		id := ev.SandboxID
		e.setBackend(id, backendView{})
		sb, err := e.store.GetSandbox(ctx, id)
		if err != nil {
			return // absent rows are ignored
		}
		if sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
			e.removeRow(ctx, id)
			return
		}
		unlock := e.gate(id)
		_, _ = e.recompose(ctx, id)
		unlock()
	case compute.EventPlatform:
		p := ev.Platform
		e.hub.publish(ev.SandboxID, Update{Platform: &openshellv1.PlatformEvent{
			TimestampMs: p.Time.UnixMilli(), Source: p.Source, Type: p.Type, Reason: p.Reason, Message: p.Message, Metadata: p.Metadata,
		}})
	}
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
