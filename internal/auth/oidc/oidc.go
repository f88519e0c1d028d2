// Package oidc authenticates users by bearer tokens of an OpenID Connect
// issuer: discovery and JWKS through coreos/go-oidc, audience check, roles
// from a dotted claim path (e.g. realm_access.roles) and scopes from a
// space-separated string or array claim.
package oidc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	gooidc "github.com/coreos/go-oidc/v3/oidc"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Options configures the authenticator.
type Options struct {
	Issuer   string
	Audience string
	// RolesClaim is a dotted path to the roles array, e.g. realm_access.roles.
	RolesClaim string
	// ScopesClaim names the scopes claim; empty turns scopes off.
	ScopesClaim string
	// HTTPClient is used for discovery and JWKS; nil = http.DefaultClient.
	HTTPClient *http.Client
}

// Authenticator verifies OIDC bearer tokens. Discovery happens on first
// use and is retried until it succeeds. Safe for concurrent use.
type Authenticator struct {
	opts Options

	mu       sync.Mutex
	verifier *gooidc.IDTokenVerifier
	provider *gooidc.Provider
}

var _ auth.Authenticator = (*Authenticator)(nil)

// New returns an authenticator for opts.
func New(opts Options) (*Authenticator, error) {
	if opts.Issuer == "" {
		return nil, errors.New("oidc: issuer is required")
	}
	if opts.Audience == "" {
		return nil, errors.New("oidc: audience is required")
	}
	return &Authenticator{opts: opts}, nil
}

func (a *Authenticator) getVerifier(ctx context.Context) (*gooidc.IDTokenVerifier, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.verifier != nil {
		return a.verifier, nil
	}
	// The provider's key set outlives this request: discovery uses ctx,
	// key fetches use a context that is never canceled.
	hc := a.opts.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	p, err := gooidc.NewProvider(gooidc.ClientContext(ctx, hc), a.opts.Issuer)
	if err != nil {
		return nil, err
	}
	keys := gooidc.NewRemoteKeySet(gooidc.ClientContext(context.Background(), hc), jwksURL(p))
	a.verifier = gooidc.NewVerifier(a.opts.Issuer, keys, &gooidc.Config{ClientID: a.opts.Audience})
	a.provider = p
	return a.verifier, nil
}

func jwksURL(p *gooidc.Provider) string {
	var c struct {
		JWKSURL string `json:"jwks_uri"`
	}
	_ = p.Claims(&c)
	return c.JWKSURL
}

// Authenticate implements auth.Authenticator.
func (a *Authenticator) Authenticate(ctx context.Context, req *auth.Request) (*auth.Principal, error) {
	tok := req.BearerToken()
	if tok == "" {
		return nil, nil
	}
	p, _, err := a.verify(ctx, tok)
	return p, err
}

// verify checks a raw token (signature, issuer, audience, expiry) and
// returns its principal. Bearer tokens and the ID tokens of the browser
// login go through here alike.
func (a *Authenticator) verify(ctx context.Context, tok string) (*auth.Principal, *gooidc.IDToken, error) {
	v, err := a.getVerifier(ctx)
	if err != nil {
		return nil, nil, errdefs.Unavailable("oidc issuer discovery failed")
	}
	idt, err := v.Verify(ctx, tok)
	if err != nil {
		return nil, nil, errdefs.Unauthenticated("invalid token: " + reason(err))
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return nil, nil, errdefs.Unauthenticated("invalid token: malformed claims")
	}
	p := &auth.Principal{
		Kind:    auth.KindUser,
		Source:  auth.SourceOIDC,
		Subject: idt.Subject,
		Roles:   strs(lookup(claims, a.opts.RolesClaim), false),
	}
	if a.opts.ScopesClaim != "" {
		p.Scopes = strs(lookup(claims, a.opts.ScopesClaim), true)
	}
	for _, k := range []string{"name", "preferred_username", "email"} {
		if s, ok := claims[k].(string); ok && s != "" {
			p.DisplayName = s
			break
		}
	}
	return p, idt, nil
}

func reason(err error) string {
	var exp *gooidc.TokenExpiredError
	switch {
	case errors.As(err, &exp):
		return "token expired"
	case strings.Contains(err.Error(), "audience"):
		return "wrong audience"
	case strings.Contains(err.Error(), "issued by a different provider"):
		return "wrong issuer"
	case strings.Contains(err.Error(), "signature"):
		return "signature verification failed"
	}
	return "verification failed"
}

// lookup follows a dotted path through nested JSON objects.
func lookup(claims map[string]any, path string) any {
	if path == "" {
		return nil
	}
	var cur any = claims
	for part := range strings.SplitSeq(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[part]
	}
	return cur
}

// strs converts a claim to strings: an array of strings, or a string
// (split on spaces when split is set).
func strs(v any, split bool) []string {
	switch t := v.(type) {
	case string:
		if split {
			return strings.Fields(t)
		}
		if t == "" {
			return nil
		}
		return []string{t}
	case []any:
		out := make([]string, 0, len(t))
		for _, e := range t {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// String describes the authenticator without secrets.
func (a *Authenticator) String() string { return fmt.Sprintf("oidc(%s)", a.opts.Issuer) }
