package auth

import (
	"context"
	"crypto/x509"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// AuthSourceHeader is set by trusted components only; the gateway strips it
// from every incoming request.
const AuthSourceHeader = "x-openshell-auth-source"

// IssueSandboxTokenMethod is the only method the Kubernetes ServiceAccount
// bootstrap authenticator is consulted for.
const IssueSandboxTokenMethod = "/openshell.v1.OpenShell/IssueSandboxToken"

// LocalDevSubject is the subject of the local development user.
const LocalDevSubject = "unauthenticated-local-dev"

// Default role names (OIDC admin_role / user_role defaults).
const (
	DefaultAdminRole = "openshell-admin"
	DefaultUserRole  = "openshell-user"
)

// Request is what authenticators see of one call.
type Request struct {
	// FullMethod is "/package.Service/Method".
	FullMethod string
	// Metadata is the incoming metadata (keys lower-case).
	Metadata metadata.MD
	// PeerCertificates is the verified client certificate chain, leaf
	// first; empty without TLS or without a verified client certificate.
	PeerCertificates []*x509.Certificate
}

// BearerToken returns the token of an "authorization: Bearer <token>"
// header, or "".
func (r *Request) BearerToken() string {
	for _, v := range r.Metadata.Get("authorization") {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
	}
	return ""
}

// Authenticator turns a request into a principal. It returns (nil, nil)
// when the request carries no credential it handles ("not mine"), and an
// error (Unauthenticated) when it handles the credential and rejects it.
// Implementations are safe for concurrent use.
type Authenticator interface {
	Authenticate(ctx context.Context, req *Request) (*Principal, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, req *Request) (*Principal, error)

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, req *Request) (*Principal, error) {
	return f(ctx, req)
}

// ChainOptions lists the authenticators of a Chain, in chain order. Nil
// entries are skipped.
type ChainOptions struct {
	// K8sServiceAccount is the Kubernetes ServiceAccount bootstrap hook,
	// consulted for IssueSandboxTokenMethod only.
	K8sServiceAccount Authenticator
	// SandboxJWT verifies gateway-minted sandbox tokens.
	SandboxJWT Authenticator
	// OIDC verifies bearer tokens of an OIDC issuer.
	OIDC Authenticator
	// MTLS maps a verified client certificate to a user principal.
	MTLS Authenticator
	// AllowUnauthenticated makes callers without credentials the local
	// development user.
	AllowUnauthenticated bool
}

// Chain is the gateway's authenticator chain: first match wins, first error
// ends it. It is safe for concurrent use.
type Chain struct {
	opts ChainOptions
	// bearer reports whether some authenticator handles bearer tokens, so
	// an unrecognized token is an error rather than anonymous.
	bearer   bool
	localDev bool
}

var _ Authenticator = (*Chain)(nil)

// NewChain returns the chain for opts. With no authenticator configured at
// all, every caller is the local development user.
func NewChain(opts ChainOptions) *Chain {
	none := opts.K8sServiceAccount == nil && opts.SandboxJWT == nil && opts.OIDC == nil && opts.MTLS == nil
	return &Chain{
		opts:     opts,
		bearer:   opts.K8sServiceAccount != nil || opts.SandboxJWT != nil || opts.OIDC != nil,
		localDev: none || opts.AllowUnauthenticated,
	}
}

// LocalDevPrincipal returns the local development user.
func LocalDevPrincipal() *Principal {
	return &Principal{
		Kind:        KindUser,
		Source:      SourceLocalDev,
		Subject:     LocalDevSubject,
		DisplayName: LocalDevSubject,
		Roles:       []string{DefaultUserRole, DefaultAdminRole},
		Scopes:      []string{ScopeAll},
	}
}

// Authenticate runs the chain. It returns (nil, nil) for an anonymous
// caller; the authorizer decides whether that is enough.
func (c *Chain) Authenticate(ctx context.Context, req *Request) (*Principal, error) {
	if c.opts.K8sServiceAccount != nil && req.FullMethod == IssueSandboxTokenMethod {
		if p, err := c.opts.K8sServiceAccount.Authenticate(ctx, req); p != nil || err != nil {
			return p, err
		}
	}
	for _, a := range []Authenticator{c.opts.SandboxJWT, c.opts.OIDC, c.opts.MTLS} {
		if a == nil {
			continue
		}
		if p, err := a.Authenticate(ctx, req); p != nil || err != nil {
			return p, err
		}
	}
	if c.bearer && req.BearerToken() != "" {
		return nil, errdefs.Unauthenticated("invalid token: not accepted by any authenticator")
	}
	if c.localDev {
		return LocalDevPrincipal(), nil
	}
	return nil, nil
}
