package lifecycle

import (
	"context"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// EditProviders rewrites the provider list of sandbox name in workspace
// under its gate: edit gets the current list and returns the new one and
// whether it changed. With expectedRV non-zero the write happens only at
// that resource version; any other version is a *store.ConflictError
// (Aborted). With expectedRV zero a concurrent write is retried on a
// fresh read. It returns the sandbox as stored and whether it changed. A
// sandbox being deleted is FailedPrecondition.
func (e *Engine) EditProviders(ctx context.Context, workspace, name string, expectedRV uint64, edit func([]string) ([]string, bool)) (*openshellv1.Sandbox, bool, error) {
	sb, err := e.Get(ctx, workspace, name)
	if err != nil {
		return nil, false, err
	}
	id := sb.GetMetadata().GetId()
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	var refuse error
	changed := false
	sb, err = e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		changed, refuse = false, nil
		if rv := sb.GetMetadata().GetResourceVersion(); expectedRV != 0 && rv != expectedRV {
			refuse = &store.ConflictError{Type: store.TypeSandbox, ID: id, Expected: expectedRV, Current: rv}
			return false
		}
		if sb.Status.Phase == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
			refuse = errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", name))
			return false
		}
		if sb.Spec == nil {
			sb.Spec = &openshellv1.SandboxSpec{}
		}
		var next []string
		next, changed = edit(sb.Spec.GetProviders())
		if changed {
			sb.Spec.Providers = next
		}
		return changed
	})
	if err != nil {
		return nil, false, err
	}
	if refuse != nil {
		return nil, false, refuse
	}
	return sb, changed, nil
}
