package sandboxes_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/sandboxes"
)

const (
	ok      = codes.OK
	nf      = codes.NotFound
	denied  = codes.PermissionDenied
	noAdopt = codes.FailedPrecondition
)

// TestAuthorization runs the lifecycle RPCs as each kind of principal on
// an OIDC gateway: team-a (user "ua", admin "aa") and team-b each hold a
// sandbox "sb".
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := sandboxes.New(sandboxes.Options{Engine: f.Engine, Authz: f.Authz(true)})
	calls := []apitest.Call{
		{Name: "GetSandbox", Do: func(ctx context.Context) error {
			_, err := svc.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "ListSandboxes", Do: func(ctx context.Context) error {
			_, err := svc.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{Workspace: "team-a"})
			return err
		}},
		{Name: "ListAllWorkspaces", Do: func(ctx context.Context) error {
			_, err := svc.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{AllWorkspaces: true})
			return err
		}},
		{Name: "StopSandbox", Do: func(ctx context.Context) error {
			_, err := svc.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "StartSandbox", Do: func(ctx context.Context) error {
			_, err := svc.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "CreateSandbox", Do: func(ctx context.Context) error {
			_, err := svc.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Workspace: "team-a"})
			return err
		}},
		{Name: "CreateSandboxOtherWorkspace", Do: func(ctx context.Context) error {
			_, err := svc.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Workspace: "team-b"})
			return err
		}},
		// The fake driver cannot adopt: callers past authorization get
		// FailedPrecondition from the engine.
		{Name: "AdoptSandbox", Do: func(ctx context.Context) error {
			_, err := svc.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: "bare", Namespace: "ns", Workspace: "team-a"})
			return err
		}},
		{Name: "DeleteOtherWorkspace", Do: func(ctx context.Context) error {
			_, err := svc.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "sb", Workspace: "team-b"})
			return err
		}},
	}
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, ok, denied, ok, ok, ok, denied, denied, nf}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, ok, denied, ok, ok, ok, denied, noAdopt, nf}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{nf, denied, denied, nf, nf, denied, denied, denied, nf}},
		{Name: "no subject", P: apitest.NoSubject, Want: []codes.Code{nf, denied, denied, nf, nf, denied, denied, denied, nf}},
		{Name: "sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{nf, denied, denied, nf, nf, denied, denied, denied, nf}},
		// Platform admins last: they delete team-b's sandbox.
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, ok, ok, ok, noAdopt, ok}},
	})
	if _, err := f.Engine.GetByID(t.Context(), f.SandboxA); err != nil {
		t.Errorf("team-a's sandbox after the matrix: %v", err)
	}
}
