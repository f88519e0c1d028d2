// Package auth authenticates callers and authorizes them per RPC. The
// authenticators form a chain (first match wins, first error ends it) that
// yields a Principal; the authorizer reads each RPC's rule from the
// openshell.options.v1.authorization method option.
package auth

import "context"

// Kind tells users from sandboxes.
type Kind int

const (
	// KindUser is a person or automation acting through the user API.
	KindUser Kind = iota + 1
	// KindSandbox is a supervisor acting for exactly one sandbox.
	KindSandbox
)

// Source names how a principal authenticated.
type Source string

const (
	SourceOIDC           Source = "oidc"
	SourceMTLS           Source = "mtls"
	SourceLocalDev       Source = "local_dev"
	SourceSandboxJWT     Source = "sandbox_jwt"
	SourceK8sSABootstrap Source = "k8s_service_account"
)

// Principal is the authenticated caller of one request.
type Principal struct {
	Kind    Kind
	Source  Source
	Subject string
	// DisplayName is informational (OIDC name claim, certificate CN).
	DisplayName string
	Roles       []string
	Scopes      []string
	// SandboxID is set for KindSandbox principals only.
	SandboxID string
}

// IsSandbox reports whether p acts for a sandbox.
func (p *Principal) IsSandbox() bool { return p != nil && p.Kind == KindSandbox }

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of the request, if any.
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok && p != nil
}
