package supervisors_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/supervisors"
	"github.com/openshell-go/openshell/internal/relay"
)

// TestAuthorization: only a sandbox principal holds a session, carries a
// relay or reports a main-process exit, and the exit only for itself.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	relays := relay.New(relay.Config{SandboxExists: f.Engine.SandboxExists})
	t.Cleanup(relays.Close)
	svc := supervisors.New(supervisors.Options{Engine: f.Engine, Relay: relays})
	calls := []apitest.Call{
		{Name: "ReportMainProcessExit", Do: func(ctx context.Context) error {
			_, err := svc.ReportMainProcessExit(ctx, &openshellv1.ReportMainProcessExitRequest{SandboxId: f.SandboxA, InstanceId: "i-1", ExitCode: 3})
			return err
		}},
		// Past authorization the relay registry answers; a user never
		// gets there.
		{Name: "ConnectSupervisor", Do: func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return svc.ConnectSupervisor(&connect{apitest.NewRecvStream[openshellv1.SupervisorMessage, openshellv1.GatewayMessage](ctx)})
		}},
	}
	const (
		ok     = codes.OK
		denied = codes.PermissionDenied
	)
	apitest.Matrix(t, calls[:1], []apitest.Case{
		{Name: "own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{ok}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{denied}},
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{denied}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{denied}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{denied}},
	})
	apitest.Matrix(t, calls[1:], []apitest.Case{
		{Name: "user on ConnectSupervisor", P: apitest.LocalDev, Want: []codes.Code{denied}},
		{Name: "admin on ConnectSupervisor", P: apitest.OIDCRoot, Want: []codes.Code{denied}},
	})
	sb, err := f.Engine.GetByID(t.Context(), f.SandboxA)
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetStatus().GetExitCode() != 3 {
		t.Errorf("exit code after the sandbox's report = %d, want 3", sb.GetStatus().GetExitCode())
	}
}

// connect adapts a RecvStream to ConnectSupervisor's bidi stream.
type connect struct {
	*apitest.RecvStream[openshellv1.SupervisorMessage, openshellv1.GatewayMessage]
}

func (c *connect) Send(*openshellv1.GatewayMessage) error { return nil }
