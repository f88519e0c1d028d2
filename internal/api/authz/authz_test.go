package authz_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

const (
	ok     = codes.OK
	nf     = codes.NotFound
	denied = codes.PermissionDenied
	unauth = codes.Unauthenticated
	busy   = codes.FailedPrecondition
)

// TestChecks runs each check as each kind of principal on an OIDC
// gateway (team-a: user "ua", admin "aa"; team-b: no members) and on one
// without OIDC.
func TestChecks(t *testing.T) {
	f := apitest.NewFixture(t)
	apitest.CreateWorkspace(t, f.Store, "closing")
	if _, err := f.Store.UpdateCAS(t.Context(), store.TypeWorkspace, authz.WorkspaceID("closing"), 0, &datamodelv1.Workspace{}, func(m proto.Message) error {
		m.(*datamodelv1.Workspace).Status.Phase = authz.WorkspaceTerminating
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	user, admin := openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER, openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN
	for _, oidc := range []bool{true, false} {
		a := f.Authz(oidc)
		calls := []apitest.Call{
			{Name: "Workspace(team-a, user)", Do: func(ctx context.Context) error { return a.Workspace(ctx, "team-a", user) }},
			{Name: "Workspace(team-a, admin)", Do: func(ctx context.Context) error { return a.Workspace(ctx, "team-a", admin) }},
			{Name: "Workspace(missing, user)", Do: func(ctx context.Context) error { return a.Workspace(ctx, "missing", user) }},
			{Name: "Sandbox(team-a/sb)", Do: func(ctx context.Context) error { return a.Sandbox(ctx, "team-a", "sb", user) }},
			{Name: "SandboxForCaller(A)", Do: func(ctx context.Context) error { _, err := a.SandboxForCaller(ctx, f.SandboxA); return err }},
			{Name: "Create(team-a)", Do: func(ctx context.Context) error { return a.Create(ctx, "team-a", user) }},
			{Name: "Create(closing)", Do: func(ctx context.Context) error { return a.Create(ctx, "closing", user) }},
			{Name: "RequirePlatformAdmin", Do: a.RequirePlatformAdmin},
			{Name: "RequireOwnSandbox(A)", Do: func(ctx context.Context) error { return authz.RequireOwnSandbox(ctx, f.SandboxA) }},
		}
		var cases []apitest.Case
		if oidc {
			cases = []apitest.Case{
				{Name: "oidc/local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, ok, ok, ok, busy, ok, denied}},
				{Name: "oidc/platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, ok, ok, busy, ok, denied}},
				{Name: "oidc/workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, ok, denied, ok, ok, ok, denied, denied, denied}},
				{Name: "oidc/workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, denied, denied, ok, ok, ok, denied, denied, denied}},
				{Name: "oidc/non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{denied, denied, denied, nf, nf, denied, denied, denied, denied}},
				{Name: "oidc/no subject", P: apitest.NoSubject, Want: []codes.Code{denied, denied, denied, nf, nf, denied, denied, denied, denied}},
				{Name: "oidc/own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{denied, denied, denied, nf, ok, denied, denied, denied, ok}},
				{Name: "oidc/other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{denied, denied, denied, nf, denied, denied, denied, denied, denied}},
			}
		} else {
			cases = []apitest.Case{
				{Name: "no oidc/mtls user", P: apitest.MTLSUser, Want: []codes.Code{ok, ok, ok, ok, ok, ok, busy, ok, denied}},
				{Name: "no oidc/own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{denied, denied, denied, nf, ok, denied, denied, denied, ok}},
				{Name: "no oidc/other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{denied, denied, denied, nf, denied, denied, denied, denied, denied}},
			}
		}
		apitest.Matrix(t, calls, cases)
	}

	// Without a principal: refused on an OIDC gateway, allowed on a
	// single-user one.
	if err := f.Authz(true).Workspace(t.Context(), "team-a", user); errdefs.Code(err) != unauth {
		t.Errorf("Workspace without a principal (OIDC) = %v, want Unauthenticated", err)
	}
	if err := f.Authz(false).Workspace(t.Context(), "team-a", user); err != nil {
		t.Errorf("Workspace without a principal (no OIDC) = %v, want nil", err)
	}
	// Refusals do not reveal what exists.
	err := f.Authz(true).Sandbox(apitest.As(t.Context(), apitest.OIDCUser("stranger")), "team-b", "sb", user)
	apitest.WantErr(t, "Sandbox(team-b/sb) as non-member", err, nf, `sandbox "sb" not found in workspace "team-b"`)
	err = f.Authz(true).Workspace(apitest.As(t.Context(), apitest.OIDCUser("ua")), "team-a", admin)
	apitest.WantErr(t, "Workspace(team-a, admin) as user", err, denied, "workspace 'team-a' requires role 'admin'")
}
