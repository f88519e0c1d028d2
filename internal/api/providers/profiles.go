package providers

import (
	"context"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	domain "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
)

// Profile scopes: a profile RPC's workspace "" is the platform scope
// (profiles visible in every workspace; writes need a platform admin), as
// OpenShell's; another workspace is that workspace's own profiles (writes
// need its admin role, reads its user role). Reads with "" show the
// default workspace's view, as every other RPC's "" does here.

// writeScope authorizes a profile write and returns its scope.
func (s *Service) writeScope(ctx context.Context, workspace string) (string, error) {
	if workspace == "" {
		return "", s.o.Authz.RequirePlatformAdmin(ctx)
	}
	return workspace, s.o.Authz.Create(ctx, workspace, roleAdmin)
}

// ListProviderProfiles lists the profiles visible in the workspace:
// built-in ones, then platform and the workspace's own user profiles.
func (s *Service) ListProviderProfiles(ctx context.Context, req *openshellv1.ListProviderProfilesRequest) (*openshellv1.ListProviderProfilesResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleUser); err != nil {
		return nil, err
	}
	all, err := s.o.Providers.Profiles(ctx, ws)
	if err != nil {
		return nil, err
	}
	off := min(int(req.GetOffset()), len(all))
	end := min(off+store.Limit(int(req.GetLimit())), len(all))
	return &openshellv1.ListProviderProfilesResponse{Profiles: all[off:end]}, nil
}

// GetProviderProfile returns one profile visible in the workspace; a
// profile of another workspace is NotFound like a missing one.
func (s *Service) GetProviderProfile(ctx context.Context, req *openshellv1.GetProviderProfileRequest) (*openshellv1.ProviderProfileResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleUser); err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, errdefs.InvalidArgument("id is required")
	}
	p, err := s.o.Providers.Profile(ctx, ws, req.GetId())
	if err != nil {
		return nil, err
	}
	return &openshellv1.ProviderProfileResponse{Profile: p}, nil
}

// ImportProviderProfiles stores new user profiles, all or none: problems
// are answered as diagnostics with imported false, as OpenShell's.
func (s *Service) ImportProviderProfiles(ctx context.Context, req *openshellv1.ImportProviderProfilesRequest) (*openshellv1.ImportProviderProfilesResponse, error) {
	scope, err := s.writeScope(ctx, req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	ps, diags, err := s.o.Providers.ImportProfiles(ctx, scope, req.GetProfiles())
	if err != nil {
		return nil, err
	}
	// As CreateProvider: a workspace being deleted marks itself
	// TERMINATING before it counts its profiles, so either that count
	// sees these or this check sees TERMINATING and takes them back.
	if scope != "" && ps != nil {
		if err := s.o.Authz.WorkspaceAcceptsSandboxes(ctx, scope); err != nil {
			for _, p := range ps {
				if _, derr := s.o.Providers.DeleteProfile(context.WithoutCancel(ctx), scope, p.GetId(), noUsers); derr != nil {
					return nil, fmt.Errorf("workspace %q stopped accepting profiles and removing profile '%s' failed: %w", scope, p.GetId(), derr)
				}
			}
			return nil, err
		}
	}
	return &openshellv1.ImportProviderProfilesResponse{Diagnostics: diags, Profiles: ps, Imported: ps != nil}, nil
}

// UpdateProviderProfiles replaces one user profile at the version the
// caller read (expected_resource_version, else the payload's).
func (s *Service) UpdateProviderProfiles(ctx context.Context, req *openshellv1.UpdateProviderProfilesRequest) (*openshellv1.UpdateProviderProfilesResponse, error) {
	scope, err := s.writeScope(ctx, req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	p, diags, err := s.o.Providers.UpdateProfile(ctx, scope, req.GetId(), req.GetProfile(), req.GetExpectedResourceVersion())
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateProviderProfilesResponse{Diagnostics: diags, Profile: p, Updated: p != nil}, nil
}

// LintProviderProfiles checks profiles as an import into the scope would,
// storing nothing; it needs the user role ("" : the platform scope,
// checked with the default workspace's membership).
func (s *Service) LintProviderProfiles(ctx context.Context, req *openshellv1.LintProviderProfilesRequest) (*openshellv1.LintProviderProfilesResponse, error) {
	if err := s.o.Authz.Workspace(ctx, req.GetWorkspace(), roleUser); err != nil {
		return nil, err
	}
	diags, err := s.o.Providers.LintProfiles(ctx, req.GetWorkspace(), req.GetProfiles())
	if err != nil {
		return nil, err
	}
	return &openshellv1.LintProviderProfilesResponse{Diagnostics: diags, Valid: !domain.HasErrors(diags)}, nil
}

// DeleteProviderProfile removes a user profile of the scope that no
// provider was created against.
func (s *Service) DeleteProviderProfile(ctx context.Context, req *openshellv1.DeleteProviderProfileRequest) (*openshellv1.DeleteProviderProfileResponse, error) {
	scope, err := s.writeScope(ctx, req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	ok, err := s.o.Providers.DeleteProfile(ctx, scope, req.GetId(), func(ctx context.Context) ([]string, error) {
		return s.o.Providers.ProvidersUsingProfile(ctx, scope, req.GetId())
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.DeleteProviderProfileResponse{Deleted: ok}, nil
}
