package compute_test

import (
	"context"
	"errors"
	"testing"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// scopingDriver has the WorkspaceScoper, ServiceAccountSelector and
// ListenerRequirer abilities.
type scopingDriver struct {
	fakeDriver
	ensured, deleted []string
}

func (d *scopingDriver) EnsureWorkspace(_ context.Context, ws string) error {
	d.ensured = append(d.ensured, ws)
	return nil
}

func (d *scopingDriver) DeleteWorkspace(_ context.Context, ws string) error {
	d.deleted = append(d.deleted, ws)
	return nil
}

func (d *scopingDriver) SelectsServiceAccounts() {}

func (d *scopingDriver) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	return []compute.ListenerRequirement{{Reason: "callback", LoopbackInterface: true}}, nil
}

func TestAbilities(t *testing.T) {
	ctx := t.Context()
	plain, able := fakeDriver{}, &scopingDriver{}

	for _, d := range []compute.Driver{plain, able} {
		if err := compute.EnsureWorkspace(ctx, d, "team-a"); err != nil {
			t.Errorf("EnsureWorkspace(%T) error = %v", d, err)
		}
		if err := compute.DeleteWorkspace(ctx, d, "team-a"); err != nil {
			t.Errorf("DeleteWorkspace(%T) error = %v", d, err)
		}
	}
	if len(able.ensured) != 1 || len(able.deleted) != 1 {
		t.Errorf("WorkspaceScoper calls = ensure %v, delete %v, want one each", able.ensured, able.deleted)
	}
	if reqs, err := compute.ListenerRequirements(ctx, plain); err != nil || reqs != nil {
		t.Errorf("ListenerRequirements(plain) = %v, %v, want none", reqs, err)
	}
	if reqs, err := compute.ListenerRequirements(ctx, able); err != nil || len(reqs) != 1 {
		t.Errorf("ListenerRequirements(able) = %v, %v, want one", reqs, err)
	}

	sa := compute.Template{ServiceAccountName: "agent"}
	err := compute.CheckTemplate(plain, "fake", sa)
	const want = "template.service_account_name is not supported by the fake compute driver (it does not select ServiceAccounts)"
	if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != want {
		t.Errorf("CheckTemplate(plain, service account) = %v, want InvalidArgument %q", err, want)
	}
	if err := compute.CheckTemplate(able, "able", sa); err != nil {
		t.Errorf("CheckTemplate(ServiceAccountSelector, service account) = %v, want nil", err)
	}
	if err := compute.CheckTemplate(plain, "fake", compute.Template{Image: "img"}); err != nil {
		t.Errorf("CheckTemplate(plain, no service account) = %v, want nil", err)
	}
}
