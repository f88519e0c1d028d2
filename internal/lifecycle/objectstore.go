package lifecycle

import (
	"context"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
)

// ObjectStore adapts the gateway's object store to the engine's Store.
type ObjectStore struct{ S store.Store }

var _ Store = ObjectStore{}

func newSandbox() *openshellv1.Sandbox { return &openshellv1.Sandbox{} }

// CreateSandbox inserts sb (MustCreate) and records the assigned version.
func (o ObjectStore) CreateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error {
	res, err := o.S.Create(ctx, store.TypeSandbox, sb)
	if err != nil {
		return err
	}
	sb.Metadata.ResourceVersion = res.ResourceVersion
	sb.Metadata.CreatedAtMs = res.CreatedAtMs
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

// DeleteSandbox removes a sandbox row.
func (o ObjectStore) DeleteSandbox(ctx context.Context, id string) error {
	_, err := o.S.Delete(ctx, store.TypeSandbox, id)
	return err
}

// ListSandboxes lists sandbox rows.
func (o ObjectStore) ListSandboxes(ctx context.Context, opts ListOptions) ([]*openshellv1.Sandbox, error) {
	return store.ListAs(ctx, o.S, store.TypeSandbox, store.ListOptions{
		Workspace: opts.Workspace, AllWorkspaces: opts.AllWorkspaces, Limit: opts.Limit, Offset: opts.Offset, LabelSelector: opts.LabelSelector,
	}, newSandbox)
}
