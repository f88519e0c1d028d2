package policy_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
)

// TestSandboxPrincipals: a supervisor reads the config of, syncs the
// policy of and reports status for its own sandbox only; users of the
// workspace read the config, and never report status.
func TestSandboxPrincipals(t *testing.T) {
	svc, f, id := setup(t)
	calls := []apitest.Call{
		{Name: "GetSandboxConfig", Do: func(ctx context.Context) error {
			_, err := svc.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: id})
			return err
		}},
		{Name: "ReportPolicyStatus", Do: func(ctx context.Context) error {
			_, err := svc.ReportPolicyStatus(ctx, &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED})
			return err
		}},
		{Name: "UpdateConfig(by name)", Do: func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: livePolicy()})
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "own sandbox", P: apitest.Sandbox(id), Want: []codes.Code{ok, ok, ok}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{denied, denied, denied}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, denied, ok}},
		// UpdateConfig needs the workspace admin role, as OpenShell.
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, denied, nf}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{nf, denied, nf}},
	})
}
