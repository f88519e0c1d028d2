// Package sandboxes implements the sandbox lifecycle RPCs of
// openshell.v1.OpenShell (CreateSandbox, GetSandbox, ListSandboxes,
// DeleteSandbox, StopSandbox, StartSandbox, AdoptSandbox) on top of the
// lifecycle engine.
//
// Every RPC checks workspace membership through authz: a sandbox in a
// workspace the caller may not see reads NotFound like a missing one.
package sandboxes

import (
	"context"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Authz  *authz.Authorizer
	// GatewayLog appends a gateway-sourced line to a sandbox's log; nil
	// drops it.
	GatewayLog func(sandboxID, level, msg string)
	// OnDeleted runs after a sandbox was deleted through DeleteSandbox
	// (drop its buffered logs, pooled connections); nil does nothing.
	OnDeleted func(sandboxID string)
}

// Service implements the sandbox lifecycle RPCs. It is safe for
// concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.GatewayLog == nil {
		o.GatewayLog = func(string, string, string) {}
	}
	if o.OnDeleted == nil {
		o.OnDeleted = func(string) {}
	}
	return &Service{o: o}
}

// CreateSandbox creates a sandbox.
func (s *Service) CreateSandbox(ctx context.Context, req *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.o.Authz.Create(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	s.o.GatewayLog(sb.GetMetadata().GetId(), "info", fmt.Sprintf("sandbox %s created", sb.GetMetadata().GetName()))
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// AdoptSandbox brings an existing agent-sandbox Sandbox custom resource
// under the gateway's management (openshell-go extension). The interceptors
// have already applied the method's rule (bearer, sandbox:write, workspace
// admin); the lifecycle engine does the rest.
func (s *Service) AdoptSandbox(ctx context.Context, req *openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.o.Authz.Create(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Adopt(ctx, req)
	if err != nil {
		return nil, err
	}
	s.o.GatewayLog(sb.GetMetadata().GetId(), "info", fmt.Sprintf("sandbox %s adopted", sb.GetMetadata().GetName()))
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// GetSandbox returns a sandbox by name.
func (s *Service) GetSandbox(ctx context.Context, req *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// ListSandboxes lists sandboxes of a workspace, or of all workspaces for
// platform admins.
func (s *Service) ListSandboxes(ctx context.Context, req *openshellv1.ListSandboxesRequest) (*openshellv1.ListSandboxesResponse, error) {
	if req.GetAllWorkspaces() && !s.o.Authz.PlatformAdmin(ctx) {
		return nil, errdefs.PermissionDenied("all_workspaces requires the platform admin role")
	}
	if !req.GetAllWorkspaces() {
		if err := s.o.Authz.Workspace(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
			return nil, err
		}
	}
	if req.GetLimit() > store.MaxLimit {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("limit exceeds maximum (%d > %d)", req.GetLimit(), store.MaxLimit))
	}
	list, err := s.o.Engine.List(ctx, lifecycle.ListOptions{
		Workspace: req.GetWorkspace(), AllWorkspaces: req.GetAllWorkspaces(),
		Limit: int(req.GetLimit()), Offset: int(req.GetOffset()), LabelSelector: req.GetLabelSelector(),
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.ListSandboxesResponse{Sandboxes: list}, nil
}

// DeleteSandbox deletes a sandbox by name.
func (s *Service) DeleteSandbox(ctx context.Context, req *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	deleted, err := s.o.Engine.Delete(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	s.o.OnDeleted(sb.GetMetadata().GetId())
	return &openshellv1.DeleteSandboxResponse{Deleted: deleted}, nil
}

// StopSandbox stops a sandbox, keeping its workspace.
func (s *Service) StopSandbox(ctx context.Context, req *openshellv1.StopSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Stop(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// StartSandbox starts a stopped sandbox.
func (s *Service) StartSandbox(ctx context.Context, req *openshellv1.StartSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Start(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}
