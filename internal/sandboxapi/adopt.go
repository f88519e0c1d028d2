package sandboxapi

import (
	"context"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// AdoptSandbox brings an existing agent-sandbox Sandbox custom resource
// under the gateway's management (openshell-go extension). The interceptors
// have already applied the method's rule (bearer, sandbox:write, workspace
// admin); the lifecycle engine does the rest.
func (s *Service) AdoptSandbox(ctx context.Context, req *openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.authorizeCreate(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Adopt(ctx, req)
	if err != nil {
		return nil, err
	}
	s.gatewayLog(sb.GetMetadata().GetId(), "info", fmt.Sprintf("sandbox %s adopted", sb.GetMetadata().GetName()))
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}
