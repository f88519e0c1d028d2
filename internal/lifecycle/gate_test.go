package lifecycle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// eventually polls cond until it holds or a deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// gateUsers is how many operations hold or await id's gate.
func gateUsers(e *Engine, id string) int {
	e.gateMu.Lock()
	defer e.gateMu.Unlock()
	if g := e.gates[id]; g != nil {
		return g.refs
	}
	return 0
}

// engineMaps reports how many gates and tracked sandboxes the engine holds.
func engineMaps(e *Engine) (gates, states int) {
	e.gateMu.Lock()
	gates = len(e.gates)
	e.gateMu.Unlock()
	e.stateMu.Lock()
	states = len(e.states)
	e.stateMu.Unlock()
	return gates, states
}

// orphanWorkloads lists backend workloads that have no row.
func orphanWorkloads(ctx context.Context, st Store, d compute.Driver) ([]string, error) {
	list, err := d.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range list {
		if _, err := st.GetSandbox(ctx, b.ID); errors.Is(err, errdefs.ErrNotFound) {
			out = append(out, b.ID)
		} else if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Defect 3: a Delete that arrives between a create's insert and its driver
// call waits for the create instead of removing the row under it, which
// left the workload the create then made without a row.
func TestDeleteRacingCreateLeavesNoOrphan(t *testing.T) {
	e, st, d := newEngine(t)
	ctx := t.Context()
	deleted := make(chan error, 1)
	st.setHooks(func(sb *openshellv1.Sandbox) {
		st.setHooks(nil, nil)
		id, name := sb.GetMetadata().GetId(), sb.GetMetadata().GetName()
		go func() {
			_, err := e.Delete(ctx, "", name)
			deleted <- err
		}()
		// The delete either finishes (the row is gone before the driver
		// was asked) or waits for the create's gate.
		eventually(t, "the racing delete to finish or wait", func() bool {
			return len(deleted) > 0 || gateUsers(e, id) >= 2
		})
	}, nil)
	if _, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "racy"}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("Delete: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Delete did not return")
	}
	orphans, err := orphanWorkloads(ctx, st, d)
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) > 0 {
		t.Fatalf("workloads without a row after create raced delete: %v", orphans)
	}
	if _, err := e.Get(ctx, "", "racy"); errdefs.Code(err) != codes.NotFound {
		t.Fatalf("Get after delete = %v, want NotFound", err)
	}
}

// Defect 2: a session that ends while the connect's write is being
// retried is not overwritten by that retry: the sandbox is not READY.
func TestSessionEndDuringRetriedWriteWins(t *testing.T) {
	e, st, _ := newEngine(t)
	ctx := t.Context()
	sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "flap"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	var once sync.Once
	st.setHooks(nil, func(*openshellv1.Sandbox) error {
		var err error
		once.Do(func() {
			// The supervisor goes away while the connect is being
			// written, and that write loses its compare-and-swap.
			e.SessionChanged(ctx, id, false, "")
			err = errdefs.ErrConflict
		})
		return err
	})
	e.SessionChanged(ctx, id, true, "inst-1")
	st.setHooks(nil, nil)
	if got := phase(t, e, "flap"); got == openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("phase after the session ended = %v, want not READY", got)
	}
	if st, _ := e.state(id); st.connected {
		t.Fatalf("engine state after the session ended: connected")
	}
}

// Defect 7: gates are freed when nobody uses them, and events or sessions
// for sandboxes without a row leave nothing behind.
func TestGatesAndStateAreFreed(t *testing.T) {
	e, _, d := newEngine(t)
	ctx := t.Context()
	var ids []string
	for _, n := range []string{"a", "b", "c"} {
		sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: n})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.GetMetadata().GetId())
		e.SessionChanged(ctx, sb.GetMetadata().GetId(), true, "i-"+n)
	}
	if _, err := e.Stop(ctx, "", "a"); err != nil {
		t.Fatal(err)
	}
	if gates, states := engineMaps(e); gates != 0 || states != 3 {
		t.Fatalf("with 3 sandboxes and no operation running: %d gates, %d states; want 0, 3", gates, states)
	}
	for _, n := range []string{"a", "b", "c"} {
		if _, err := e.Delete(ctx, "", n); err != nil {
			t.Fatal(err)
		}
	}
	// Late news about deleted sandboxes and news about unknown ones.
	for _, id := range append(ids, "never-existed") {
		e.apply(ctx, compute.Event{Kind: compute.EventSandbox, Sandbox: compute.Sandbox{ID: id, Status: compute.Status{Conditions: ready("True", "Running")}}})
		e.apply(ctx, compute.Event{Kind: compute.EventPlatform, SandboxID: id, Platform: compute.PlatformEvent{Reason: "Late"}})
		e.apply(ctx, compute.Event{Kind: compute.EventDeleted, SandboxID: id})
		e.SessionChanged(ctx, id, true, "late")
		if err := e.ReportMainProcessExit(ctx, id, "late", 1); errdefs.Code(err) != codes.NotFound {
			t.Fatalf("ReportMainProcessExit(%s) = %v, want NotFound", id, err)
		}
	}
	if gates, states := engineMaps(e); gates != 0 || states != 0 {
		t.Fatalf("after deleting every sandbox: %d gates, %d states; want none", gates, states)
	}
	if n := len(e.hub.events); n != 0 {
		t.Fatalf("platform event tails kept for %d deleted or unknown sandboxes", n)
	}
	if len(d.sandboxes) != 0 {
		t.Fatalf("workloads left: %v", d.sandboxes)
	}
}

// Defect 4: a workspace that stops accepting sandboxes between the API's
// check and the insert refuses the create after the insert; the row goes
// again and the driver is never asked.
func TestCreateInWorkspaceBeingDeleted(t *testing.T) {
	st, d := newMemStore(), newFakeDriver()
	var sawRow bool
	accepts := func(ctx context.Context, ws string) error {
		_, err := st.GetSandboxByName(ctx, ws, "late")
		sawRow = err == nil
		return errdefs.FailedPrecondition(`workspace "team" is being deleted`)
	}
	e, err := New(t.Context(), Options{Store: st, Driver: d, WorkspaceAccepts: accepts})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "late", Workspace: "team"})
	if errdefs.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Create in a terminating workspace = %v, want FailedPrecondition", err)
	}
	if !sawRow {
		t.Fatal("WorkspaceAccepts ran before the row was inserted: a workspace delete counting in between would miss it")
	}
	if n := len(st.rows); n != 0 {
		t.Fatalf("%d rows left after the refused create", n)
	}
	if len(d.tokens) != 0 || len(d.ensured) != 0 {
		t.Fatalf("driver was asked (create %d, ensure workspace %v) for a refused create", len(d.tokens), d.ensured)
	}
	if gates, states := engineMaps(e); gates != 0 || states != 0 {
		t.Fatalf("after the refused create: %d gates, %d states; want none", gates, states)
	}
	// A workspace deleted outright reads the same way.
	e.workspaces = func(context.Context, string) error { return errdefs.NotFound(`workspace "team" not found`) }
	if _, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "late", Workspace: "team"}); errdefs.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Create in a deleted workspace = %v, want FailedPrecondition", err)
	}
}

// Defect 5: the engine's row deletes are conditional. A row changed
// between the engine's read and its delete is read again, and the delete
// decides on the fresh row.
func TestRowDeleteIsConditional(t *testing.T) {
	e, st, d := newEngine(t)
	ctx := t.Context()
	sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "cas"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	stale := sb.GetMetadata().GetResourceVersion()
	if err := st.DeleteSandbox(ctx, id, stale+7); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("DeleteSandbox at a wrong version = %v, want Conflict", err)
	}
	// Another writer bumps the row while the delete is in flight.
	d.mu.Lock()
	d.sandboxes = map[string]compute.Sandbox{}
	d.mu.Unlock()
	var once sync.Once
	g := e.lock(id)
	st.mu.Lock()
	st.rows[id].Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
	st.mu.Unlock()
	removed, err := e.removeIf(ctx, id, func(sb *openshellv1.Sandbox) bool {
		once.Do(func() {
			st.mu.Lock()
			st.rows[id].Metadata.ResourceVersion++
			st.mu.Unlock()
		})
		return isDeleting(sb)
	})
	e.unlock(ctx, id, g)
	if err != nil || removed == nil {
		t.Fatalf("removeIf after a concurrent change = %v, %v; want the row removed on the second read", removed, err)
	}
	if _, err := st.GetSandbox(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("row after removeIf: %v", err)
	}
}
