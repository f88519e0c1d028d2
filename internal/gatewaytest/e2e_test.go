package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestSDKFlow is what a client written against the OpenShell v1 API does
// (the Go SDK's smoke test): create, poll GetSandbox until READY, exec,
// delete — with plain grpc-go and the generated stubs.
func TestSDKFlow(t *testing.T) {
	sdkFlow(t, Start(t, Options{}))
}

func sdkFlow(t *testing.T, g *Gateway) {
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	h, err := c.Health(ctx, &openshellv1.HealthRequest{})
	if err != nil || h.GetStatus() != openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY {
		t.Fatalf("Health = %v, %v", h, err)
	}
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{
		Name: "go-smoke-000000001",
		Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}},
	})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	if id == "" || created.GetSandbox().GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING && created.GetSandbox().GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("created sandbox = %v", created.GetSandbox())
	}
	WaitPhase(ctx, t, c, "go-smoke-000000001", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)

	stdout, stderr, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "printf ok"}})
	if err != nil || stdout != "ok" || stderr != "" || code != 0 {
		t.Fatalf("exec = %q %q %d %v, want \"ok\" \"\" 0", stdout, stderr, code, err)
	}
	stdout, stderr, code, err = Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil || stdout != "out\n" || stderr != "err\n" || code != 3 {
		t.Fatalf("exec = %q %q %d %v, want out/err/3", stdout, stderr, code, err)
	}

	del, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "go-smoke-000000001"})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteSandbox = %v, %v", del, err)
	}
	_, err = c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "go-smoke-000000001"})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "not found") {
		t.Fatalf("GetSandbox after delete = %v, want NotFound", err)
	}
}
