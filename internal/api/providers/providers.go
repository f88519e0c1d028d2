// Package providers implements the provider RPCs of openshell.v1.OpenShell
// that exist so far: ListSandboxProviders (users of the sandbox's
// workspace) and GetSandboxProviderEnvironment (the sandbox's own
// supervisor). Providers themselves are not implemented yet: both
// answer empty for an existing sandbox.
package providers

import (
	"context"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/lifecycle"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Authz  *authz.Authorizer
}

// Service implements the provider RPCs. It is safe for concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service { return &Service{o: o} }

// ListSandboxProviders lists providers attached to a sandbox. Providers
// are not implemented yet, so the list is empty for an existing sandbox.
func (s *Service) ListSandboxProviders(ctx context.Context, req *openshellv1.ListSandboxProvidersRequest) (*openshellv1.ListSandboxProvidersResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetSandboxName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	if _, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetSandboxName()); err != nil {
		return nil, err
	}
	return &openshellv1.ListSandboxProvidersResponse{}, nil
}

// GetSandboxProviderEnvironment returns provider credentials for the
// sandbox, to its own supervisor only. Providers are not implemented yet:
// the environment is empty.
func (s *Service) GetSandboxProviderEnvironment(ctx context.Context, req *openshellv1.GetSandboxProviderEnvironmentRequest) (*openshellv1.GetSandboxProviderEnvironmentResponse, error) {
	if err := authz.RequireOwnSandbox(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	if _, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &openshellv1.GetSandboxProviderEnvironmentResponse{}, nil
}
