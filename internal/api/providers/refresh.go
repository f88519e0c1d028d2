package providers

import (
	"context"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/lifecycle"
)

// GetProviderRefreshStatus reports the refresh of one credential, or of
// every credential of the provider when credential_key is empty.
func (s *Service) GetProviderRefreshStatus(ctx context.Context, req *openshellv1.GetProviderRefreshStatusRequest) (*openshellv1.GetProviderRefreshStatusResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleUser); err != nil {
		return nil, err
	}
	sts, err := s.o.Providers.RefreshStatuses(ctx, ws, req.GetProvider(), req.GetCredentialKey())
	if err != nil {
		return nil, err
	}
	return &openshellv1.GetProviderRefreshStatusResponse{Credentials: sts}, nil
}

// ConfigureProviderRefresh stores how a credential is minted (OAuth2
// refresh token or client credentials against the provider profile's token
// endpoint); secret material is sealed.
func (s *Service) ConfigureProviderRefresh(ctx context.Context, req *openshellv1.ConfigureProviderRefreshRequest) (*openshellv1.ConfigureProviderRefreshResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	st, err := s.o.Providers.ConfigureRefresh(ctx, ws, req)
	if err != nil {
		return nil, err
	}
	return &openshellv1.ConfigureProviderRefreshResponse{Status: st}, nil
}

// RotateProviderCredential mints and swaps in a new value now; a failed
// mint revokes the current value.
func (s *Service) RotateProviderCredential(ctx context.Context, req *openshellv1.RotateProviderCredentialRequest) (*openshellv1.RotateProviderCredentialResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	st, err := s.o.Providers.RotateCredential(ctx, ws, req.GetProvider(), req.GetCredentialKey())
	if err != nil {
		return nil, err
	}
	return &openshellv1.RotateProviderCredentialResponse{Status: st}, nil
}

// DeleteProviderRefresh removes a credential's refresh and its material.
func (s *Service) DeleteProviderRefresh(ctx context.Context, req *openshellv1.DeleteProviderRefreshRequest) (*openshellv1.DeleteProviderRefreshResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	ok, err := s.o.Providers.DeleteRefresh(ctx, ws, req.GetProvider(), req.GetCredentialKey())
	if err != nil {
		return nil, err
	}
	return &openshellv1.DeleteProviderRefreshResponse{Deleted: ok}, nil
}
