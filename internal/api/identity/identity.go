// Package identity implements the sandbox identity RPCs of
// openshell.v1.OpenShell: RefreshSandboxToken (a sandbox JWT for a fresh
// one) and IssueSandboxToken (a platform bootstrap identity, such as a
// Kubernetes ServiceAccount token, for the first JWT). Both mint only for
// the calling sandbox principal, and only while its sandbox exists.
//
// RefreshSandboxToken also mints the extension credentials a supervisor
// asks for by name (extension_service_names): one token per supervisor
// middleware service its sandbox's effective policy selects, with
// caller_kind supervisor (see extension.go).
package identity

import (
	"context"
	"fmt"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// TokenMinter mints sandbox JWTs.
type TokenMinter interface {
	Mint(sandboxID string) (token string, expiresAt time.Time, err error)
}

// SandboxChecker reports NotFound for a sandbox that does not exist
// (lifecycle.Engine).
type SandboxChecker interface {
	SandboxExists(ctx context.Context, id string) error
}

// Options wire a Service.
type Options struct {
	Sandboxes SandboxChecker
	Minter    TokenMinter // nil: both RPCs answer Unavailable
	// ExtensionServices resolves the supervisor middleware services a
	// sandbox's effective policy selects; nil = none for every sandbox, so
	// every requested extension credential is refused.
	ExtensionServices ExtensionServices
}

// Service implements the identity RPCs. It is safe for concurrent use.
type Service struct {
	o       Options
	limiter *mintLimiter
}

// New returns a Service.
func New(o Options) *Service {
	return &Service{o: o, limiter: newMintLimiter(mintWindow, mintsPerWindow, time.Now)}
}

// RefreshSandboxToken mints a fresh JWT for the calling sandbox, and the
// extension credentials it names.
func (s *Service) RefreshSandboxToken(ctx context.Context, req *openshellv1.RefreshSandboxTokenRequest) (*openshellv1.RefreshSandboxTokenResponse, error) {
	tok, expMs, err := s.mintFor(ctx, auth.SourceSandboxJWT, "only a sandbox JWT can be refreshed")
	if err != nil {
		return nil, err
	}
	resp := &openshellv1.RefreshSandboxTokenResponse{Token: tok, ExpiresAtMs: expMs}
	if names := req.GetExtensionServiceNames(); len(names) > 0 {
		p, _ := auth.FromContext(ctx) // mintFor checked it is a sandbox
		if resp.ExtensionCredentials, err = s.extensionCredentials(ctx, p.SandboxID, names); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// IssueSandboxToken exchanges a Kubernetes ServiceAccount token for a
// sandbox JWT. The exchange itself is authenticated by the Kubernetes
// bootstrap authenticator; any other principal is refused.
func (s *Service) IssueSandboxToken(ctx context.Context, _ *openshellv1.IssueSandboxTokenRequest) (*openshellv1.IssueSandboxTokenResponse, error) {
	tok, expMs, err := s.mintFor(ctx, auth.SourceK8sSABootstrap, "this principal cannot mint a sandbox token; use RefreshSandboxToken")
	if err != nil {
		return nil, err
	}
	return &openshellv1.IssueSandboxTokenResponse{Token: tok, ExpiresAtMs: expMs}, nil
}

// mintFor mints a JWT for the calling sandbox principal, which must have
// authenticated through source (refused with refusal otherwise) and whose
// sandbox must still exist. expiresAtMs is 0 for non-expiring tokens.
func (s *Service) mintFor(ctx context.Context, source auth.Source, refusal string) (token string, expiresAtMs int64, err error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return "", 0, errdefs.PermissionDenied("this method requires a sandbox principal")
	}
	if p.Source != source {
		return "", 0, errdefs.PermissionDenied(refusal)
	}
	if s.o.Minter == nil {
		return "", 0, errdefs.Unavailable("sandbox JWT minting is not configured on this gateway")
	}
	if err := s.o.Sandboxes.SandboxExists(ctx, p.SandboxID); err != nil {
		return "", 0, err
	}
	tok, exp, err := s.o.Minter.Mint(p.SandboxID)
	if err != nil {
		return "", 0, fmt.Errorf("mint sandbox token: %w", err)
	}
	if !exp.IsZero() {
		expiresAtMs = exp.UnixMilli()
	}
	return tok, expiresAtMs, nil
}
