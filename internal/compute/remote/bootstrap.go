package remote

import (
	"context"
	"errors"

	computev1 "github.com/openshell-go/openshell/api/openshell/compute/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

var _ compute.BootstrapAuthenticatorProvider = (*Driver)(nil)

// BootstrapAuthenticator implements compute.BootstrapAuthenticatorProvider
// for a separately served driver: it asks the driver whether it serves the
// sandbox bootstrap (AuthenticateBootstrapToken with an empty token) and
// returns nil when it does not (Unimplemented). The authenticator forwards
// each IssueSandboxToken bearer token to the driver, which verifies it with
// its platform credentials.
func (d *Driver) BootstrapAuthenticator(ctx context.Context) (auth.Authenticator, error) {
	_, err := d.c.AuthenticateBootstrapToken(ctx, &computev1.AuthenticateBootstrapTokenRequest{})
	if err = fromWire(err); errors.Is(err, errdefs.ErrUnimplemented) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return bootstrapAuthenticator{d.c}, nil
}

// bootstrapAuthenticator is the gateway side of the remote bootstrap.
type bootstrapAuthenticator struct{ c computev1.ComputeDriverClient }

// Authenticate implements auth.Authenticator: consulted only for
// IssueSandboxToken with a bearer token; an unrecognised token is "not
// mine" (nil, nil); the driver's refusals keep their kind and text.
func (a bootstrapAuthenticator) Authenticate(ctx context.Context, req *auth.Request) (*auth.Principal, error) {
	if req.FullMethod != auth.IssueSandboxTokenMethod {
		return nil, nil
	}
	token := req.BearerToken()
	if token == "" {
		return nil, nil
	}
	r, err := a.c.AuthenticateBootstrapToken(ctx, &computev1.AuthenticateBootstrapTokenRequest{Token: token})
	if err != nil {
		return nil, fromWire(err)
	}
	if !r.GetRecognized() {
		return nil, nil
	}
	if r.GetSandboxId() == "" {
		return nil, errdefs.Unavailable("remote compute driver recognised a bootstrap token without naming its sandbox")
	}
	return &auth.Principal{
		Kind:        auth.KindSandbox,
		Source:      auth.SourceK8sSABootstrap,
		Subject:     "spiffe://openshell/sandbox/" + r.GetSandboxId(),
		DisplayName: r.GetDisplayName(),
		SandboxID:   r.GetSandboxId(),
	}, nil
}

// AuthenticateBootstrapToken serves the bootstrap of the driver it serves,
// when that driver is a compute.BootstrapAuthenticatorProvider with the
// bootstrap on; otherwise it answers Unimplemented.
func (s *server) AuthenticateBootstrapToken(ctx context.Context, req *computev1.AuthenticateBootstrapTokenRequest) (*computev1.AuthenticateBootstrapTokenResponse, error) {
	a, err := s.bootstrapAuthenticator(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetToken() == "" {
		return &computev1.AuthenticateBootstrapTokenResponse{}, nil
	}
	p, err := a.Authenticate(ctx, &auth.Request{
		FullMethod: auth.IssueSandboxTokenMethod,
		Metadata:   map[string][]string{"authorization": {"Bearer " + req.GetToken()}},
	})
	if err != nil {
		return nil, err
	}
	if p == nil {
		return &computev1.AuthenticateBootstrapTokenResponse{}, nil
	}
	if !p.IsSandbox() || p.SandboxID == "" {
		return nil, errdefs.PermissionDenied("bootstrap token does not identify a sandbox")
	}
	return &computev1.AuthenticateBootstrapTokenResponse{Recognized: true, SandboxId: p.SandboxID, DisplayName: p.DisplayName}, nil
}

// bootstrapAuthenticator returns the served driver's bootstrap
// authenticator, built once.
func (s *server) bootstrapAuthenticator(ctx context.Context) (auth.Authenticator, error) {
	s.bootMu.Lock()
	defer s.bootMu.Unlock()
	if s.boot != nil {
		return s.boot, nil
	}
	p, ok := s.d.(compute.BootstrapAuthenticatorProvider)
	if !ok {
		return nil, errdefs.Unimplemented("compute driver does not serve sandbox bootstrap authentication")
	}
	a, err := p.BootstrapAuthenticator(ctx)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, errdefs.Unimplemented("sandbox bootstrap authentication is turned off in this compute driver")
	}
	s.boot = a
	return a, nil
}
