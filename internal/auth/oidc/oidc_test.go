package oidc

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc/metadata"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// issuer is an in-process OpenID provider serving discovery and JWKS.
type issuer struct {
	srv *httptest.Server
	key *rsa.PrivateKey
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &issuer{key: key}
	mux := http.NewServeMux()
	is.srv = httptest.NewTLSServer(mux)
	t.Cleanup(is.srv.Close)
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": is.srv.URL, "jwks_uri": is.srv.URL + "/keys",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("/keys", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	return is
}

func (is *issuer) sign(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAuthenticate(t *testing.T) {
	is := newIssuer(t)
	a, err := New(Options{Issuer: is.srv.URL, Audience: "openshell-cli", RolesClaim: "realm_access.roles",
		ScopesClaim: "scp", HTTPClient: is.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	base := func() map[string]any {
		return map[string]any{"iss": is.srv.URL, "aud": "openshell-cli", "sub": "bob", "iat": now.Unix(),
			"exp": now.Add(time.Hour).Unix(), "preferred_username": "bobby",
			"realm_access": map[string]any{"roles": []string{"openshell-user", "x"}}}
	}
	withScopes := func(v any) map[string]any { c := base(); c["scp"] = v; return c }
	with := func(k string, v any) map[string]any { c := base(); c[k] = v; return c }
	otherKey, _ := rsa.GenerateKey(rand.Reader, 2048)

	tests := []struct {
		name       string
		tok        string
		wantScopes []string
		wantErr    string
	}{
		{"string scopes", is.sign(t, is.key, withScopes("sandbox:read openshell:all")), []string{"sandbox:read", "openshell:all"}, ""},
		{"array scopes", is.sign(t, is.key, withScopes([]string{"a", "b"})), []string{"a", "b"}, ""},
		{"wrong audience", is.sign(t, is.key, with("aud", "other")), nil, "invalid token: wrong audience"},
		{"expired", is.sign(t, is.key, with("exp", now.Add(-time.Hour).Unix())), nil, "invalid token: token expired"},
		{"wrong key", is.sign(t, otherKey, base()), nil, "invalid token: signature verification failed"},
		{"garbage", "garbage", nil, "invalid token: verification failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Authenticate(t.Context(), &auth.Request{Metadata: metadata.Pairs("authorization", "Bearer "+tc.tok)})
			if tc.wantErr != "" {
				if !errors.Is(err, errdefs.ErrUnauthenticated) || err.Error() != tc.wantErr {
					t.Fatalf("Authenticate() = %v, want Unauthenticated %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Subject != "bob" || p.DisplayName != "bobby" || p.Source != auth.SourceOIDC || p.Kind != auth.KindUser ||
				!slices.Equal(p.Roles, []string{"openshell-user", "x"}) || !slices.Equal(p.Scopes, tc.wantScopes) {
				t.Errorf("Authenticate() = %+v", p)
			}
		})
	}
	if p, err := a.Authenticate(t.Context(), &auth.Request{Metadata: metadata.MD{}}); p != nil || err != nil {
		t.Errorf("Authenticate() without a token = %v, %v, want (nil, nil)", p, err)
	}
}

func TestDiscoveryFailureIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	a, err := New(Options{Issuer: srv.URL, Audience: "x"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Authenticate(t.Context(), &auth.Request{Metadata: metadata.Pairs("authorization", "Bearer t")})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Authenticate() = %v, want Unavailable", err)
	}
}
