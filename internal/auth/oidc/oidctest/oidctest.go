// Package oidctest runs a small OpenID provider on loopback for tests:
// discovery, JWKS, an authorization endpoint that approves at once as the
// current user (authorization code with PKCE S256 only) and a token
// endpoint that answers with an RS256 ID token. Tokens are signed with
// go-jose, so the real gateway verifies them. Safe for concurrent use.
package oidctest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// User is who the authorization endpoint logs in.
type User struct {
	Subject string
	// Roles go to the realm_access.roles claim.
	Roles []string
}

// Issuer is the provider. Its URL is the issuer URL.
type Issuer struct {
	URL      string
	clientID string
	secret   string
	srv      *httptest.Server
	key      *rsa.PrivateKey
	signer   jose.Signer

	mu       sync.Mutex
	user     User
	audience string
	codes    map[string]grant
	secrets  []string
}

type grant struct {
	user                          User
	challenge, redirect, clientID string
	nonce                         string
}

// New starts an issuer for the OAuth client clientID (a confidential
// client when secret is not empty); ID tokens carry aud = clientID until
// SetAudience. The server stops with the test.
func New(t testing.TB, clientID, secret string) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	is := &Issuer{clientID: clientID, secret: secret, key: key, signer: signer, audience: clientID,
		codes: map[string]grant{}, user: User{Subject: "alice", Roles: []string{"openshell-user"}}}
	if secret != "" {
		is.secrets = append(is.secrets, secret)
	}
	mux := http.NewServeMux()
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.URL = is.srv.URL
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": is.URL, "authorization_endpoint": is.URL + "/authorize",
			"token_endpoint": is.URL + "/token", "jwks_uri": is.URL + "/keys", "response_types_supported": []string{"code"},
			"id_token_signing_alg_values_supported": []string{"RS256"}, "code_challenge_methods_supported": []string{"S256"}})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", is.authorize)
	mux.HandleFunc("POST /token", is.token)
	return is
}

// SetUser makes the authorization endpoint log in u from now on.
func (is *Issuer) SetUser(u User) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.user = u
}

// SetAudience changes the aud of the ID tokens issued from now on.
func (is *Issuer) SetAudience(aud string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.audience = aud
}

// Secrets returns every secret the issuer knows or handed out so far:
// the client secret, codes, ID and access tokens.
func (is *Issuer) Secrets() []string {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]string(nil), is.secrets...)
}

// Token signs a bearer token for u with audience aud, valid for an hour.
func (is *Issuer) Token(t testing.TB, u User, aud string) string {
	t.Helper()
	tok, err := is.sign(u, aud, "")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (is *Issuer) sign(u User, aud, nonce string) (string, error) {
	now := time.Now()
	claims := map[string]any{"iss": is.URL, "aud": aud, "sub": u.Subject, "iat": now.Unix(),
		"exp": now.Add(time.Hour).Unix(), "preferred_username": u.Subject, "jti": rand.Text(),
		"realm_access": map[string]any{"roles": u.Roles}}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	tok, err := jwt.Signed(is.signer).Claims(claims).Serialize()
	if err == nil {
		is.mu.Lock()
		is.secrets = append(is.secrets, tok)
		is.mu.Unlock()
	}
	return tok, err
}

func (is *Issuer) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	redirect, err := url.Parse(q.Get("redirect_uri"))
	if err != nil || (redirect.Scheme != "http" && redirect.Scheme != "https") || redirect.Host == "" {
		http.Error(w, "redirect_uri must be an absolute http(s) URL", http.StatusBadRequest)
		return
	}
	if q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("client_id") != is.clientID {
		http.Error(w, "authorization code with PKCE S256 for the known client only", http.StatusBadRequest)
		return
	}
	code := rand.Text()
	is.mu.Lock()
	is.codes[code] = grant{user: is.user, challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri"),
		clientID: q.Get("client_id"), nonce: q.Get("nonce")}
	is.secrets = append(is.secrets, code)
	is.mu.Unlock()
	v := url.Values{"code": {code}, "state": {q.Get("state")}}
	http.Redirect(w, r, redirect.String()+"?"+v.Encode(), http.StatusFound)
}

func tokenError(w http.ResponseWriter, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

func (is *Issuer) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "authorization_code" {
		tokenError(w, "unsupported_grant_type")
		return
	}
	f := r.PostForm
	clientID, secret, basic := r.BasicAuth()
	if !basic {
		clientID, secret = f.Get("client_id"), f.Get("client_secret")
	}
	if clientID != is.clientID || subtle.ConstantTimeCompare([]byte(secret), []byte(is.secret)) != 1 {
		tokenError(w, "invalid_client")
		return
	}
	is.mu.Lock()
	g, ok := is.codes[f.Get("code")]
	delete(is.codes, f.Get("code")) // one use
	aud := is.audience
	is.mu.Unlock()
	sum := sha256.Sum256([]byte(f.Get("code_verifier")))
	if !ok || g.redirect != f.Get("redirect_uri") || g.clientID != clientID ||
		base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
		tokenError(w, "invalid_grant")
		return
	}
	idt, err := is.sign(g.user, aud, g.nonce)
	if err != nil {
		tokenError(w, "server_error")
		return
	}
	access, err := is.sign(g.user, aud, "")
	if err != nil {
		tokenError(w, "server_error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": access, "id_token": idt, "token_type": "Bearer", "expires_in": 3600})
}
