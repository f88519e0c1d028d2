package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store"
)

// ObjectStore adapts the gateway's object store to the engine's Store. It
// keeps sandbox objects and writes the one scoped record a create makes
// (policy version 1); it needs nothing else of the store.
type ObjectStore struct{ S SandboxObjects }

// SandboxObjects is the part of the store ObjectStore uses.
type SandboxObjects interface {
	store.Objects
	CreateScoped(ctx context.Context, rec store.Record) (store.Record, error)
}

var _ Store = ObjectStore{}

func newSandbox() *openshellv1.Sandbox { return &openshellv1.Sandbox{} }

// CreateSandbox inserts sb (MustCreate) and records the assigned version.
// A sandbox created with spec.policy also gets that policy stored as
// revision 1 (PENDING until its supervisor reports); when that write fails
// the row is removed again and the error returned.
func (o ObjectStore) CreateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error {
	res, err := o.S.Create(ctx, store.TypeSandbox, sb)
	if err != nil {
		return err
	}
	sb.Metadata.ResourceVersion = res.ResourceVersion
	sb.Metadata.CreatedAtMs = res.CreatedAtMs
	if p := sb.GetSpec().GetPolicy(); p != nil {
		rec, err := policy.BaselineRecord(sb.Metadata.Id, p, time.UnixMilli(res.CreatedAtMs))
		if err == nil {
			_, err = o.S.CreateScoped(ctx, rec)
		}
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			// Not the caller's "sandbox already exists": an internal fault.
			err = fmt.Errorf("policy version 1 of sandbox %s is already stored", sb.Metadata.Id)
		}
		if err != nil {
			if derr := o.S.DeleteIf(context.WithoutCancel(ctx), store.TypeSandbox, sb.Metadata.Id, res.ResourceVersion); derr != nil {
				return fmt.Errorf("store policy version 1: %w (and removing the sandbox row failed: %w)", err, derr)
			}
			return fmt.Errorf("store policy version 1: %w", err)
		}
	}
	return nil
}

// GetSandbox reads a sandbox by id.
func (o ObjectStore) GetSandbox(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	return store.GetAs(ctx, o.S, store.TypeSandbox, id, newSandbox)
}

// GetSandboxByName reads a sandbox by workspace and name.
func (o ObjectStore) GetSandboxByName(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
	sb := newSandbox()
	if err := o.S.GetByName(ctx, store.TypeSandbox, workspace, name, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// UpdateSandbox writes sb conditioned on its resource version.
func (o ObjectStore) UpdateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error {
	res, err := o.S.Update(ctx, store.TypeSandbox, sb, sb.GetMetadata().GetResourceVersion())
	if err != nil {
		return err
	}
	sb.Metadata.ResourceVersion = res.ResourceVersion
	return nil
}

// DeleteSandbox removes a sandbox row at expectedRV; the store removes the
// records scoped to it (policy revisions, settings, draft policy chunks)
// in the same transaction.
func (o ObjectStore) DeleteSandbox(ctx context.Context, id string, expectedRV uint64) error {
	return o.S.DeleteIf(ctx, store.TypeSandbox, id, expectedRV)
}

// ListSandboxes lists sandbox rows.
func (o ObjectStore) ListSandboxes(ctx context.Context, opts ListOptions) ([]*openshellv1.Sandbox, error) {
	return store.ListAs(ctx, o.S, store.TypeSandbox, store.ListOptions{
		Workspace: opts.Workspace, AllWorkspaces: opts.AllWorkspaces, Limit: opts.Limit, Offset: opts.Offset, LabelSelector: opts.LabelSelector,
	}, newSandbox)
}
