package providers_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/providers"
)

// TestAuthorization: users of the sandbox's workspace list its providers;
// only the sandbox's own supervisor reads its provider environment.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := providers.New(providers.Options{Engine: f.Engine, Authz: f.Authz(true)})
	calls := []apitest.Call{
		{Name: "ListSandboxProviders", Do: func(ctx context.Context) error {
			_, err := svc.ListSandboxProviders(ctx, &openshellv1.ListSandboxProvidersRequest{SandboxName: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "GetSandboxProviderEnvironment", Do: func(ctx context.Context) error {
			_, err := svc.GetSandboxProviderEnvironment(ctx, &openshellv1.GetSandboxProviderEnvironmentRequest{SandboxId: f.SandboxA})
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, denied}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, denied}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, denied}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{nf, denied}},
		{Name: "own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{nf, ok}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{nf, denied}},
	})
}
