// Package oidctest runs a small OpenID provider on loopback for tests:
// discovery, JWKS, an authorization endpoint that approves at once as the
// current user (authorization code with PKCE S256 only) and a token
// endpoint that answers with an RS256 ID token. [Options] add rotating
// refresh tokens, a client credentials client, device authorization and
// RFC 7009 revocation. Tokens are signed with go-jose, so the real gateway
// verifies them. The issuer records every authorization, token and
// revocation request for tests to inspect. Safe for concurrent use.
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

// Options are the provider's abilities beyond the authorization code
// grant. The zero value turns them all off.
type Options struct {
	// Refresh hands out a refresh token with each authorization code,
	// device and refresh grant and accepts it once (rotation).
	Refresh bool
	// ServiceClientID and ServiceSecret, when set, are a confidential
	// client that may use the client credentials grant; its tokens name
	// "service-account-<ServiceClientID>" with the role openshell-user.
	ServiceClientID, ServiceSecret string
	// DeviceUser, when its Subject is set, turns on device authorization
	// (user code WDJB-MJHT at URL/activate): the token endpoint answers
	// authorization_pending to a device code's first poll and logs
	// DeviceUser in on the next.
	DeviceUser User
	// Revocation turns on an RFC 7009 revocation endpoint; a revoked
	// refresh token stops working.
	Revocation bool
	// TokenTTL is the lifetime of the tokens issued; 0 means an hour.
	TokenTTL time.Duration
}

// Issuer is the provider. Its URL is the issuer URL.
type Issuer struct {
	URL      string
	clientID string
	secret   string
	opts     Options
	srv      *httptest.Server
	key      *rsa.PrivateKey
	signer   jose.Signer

	mu            sync.Mutex
	user          User
	audience      string
	codes         map[string]grant
	refresh       map[string]User // refresh token -> its user
	devices       map[string]int  // device code -> polls so far
	secrets       []string
	authorizeReqs []url.Values
	tokenReqs     []url.Values
	revokeReqs    []url.Values
	beforeRefresh func()
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
	return NewWithOptions(t, clientID, secret, Options{})
}

// NewWithOptions is [New] with the abilities opts turns on.
func NewWithOptions(t testing.TB, clientID, secret string, opts Options) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = time.Hour
	}
	is := &Issuer{clientID: clientID, secret: secret, opts: opts, key: key, signer: signer, audience: clientID,
		codes: map[string]grant{}, refresh: map[string]User{}, devices: map[string]int{},
		user: User{Subject: "alice", Roles: []string{"openshell-user"}}}
	for _, s := range []string{secret, opts.ServiceSecret} {
		if s != "" {
			is.secrets = append(is.secrets, s)
		}
	}
	mux := http.NewServeMux()
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.URL = is.srv.URL
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		doc := map[string]any{"issuer": is.URL, "authorization_endpoint": is.URL + "/authorize",
			"token_endpoint": is.URL + "/token", "jwks_uri": is.URL + "/keys", "response_types_supported": []string{"code"},
			"id_token_signing_alg_values_supported": []string{"RS256"}, "code_challenge_methods_supported": []string{"S256"}}
		if opts.DeviceUser.Subject != "" {
			doc["device_authorization_endpoint"] = is.URL + "/device"
		}
		if opts.Revocation {
			doc["revocation_endpoint"] = is.URL + "/revoke"
		}
		_ = json.NewEncoder(w).Encode(doc)
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", is.authorize)
	mux.HandleFunc("POST /token", is.token)
	if opts.DeviceUser.Subject != "" {
		mux.HandleFunc("POST /device", is.device)
	}
	if opts.Revocation {
		mux.HandleFunc("POST /revoke", is.revoke)
	}
	return is
}

// Close stops the server before the test ends, as an issuer that went
// away.
func (is *Issuer) Close() { is.srv.Close() }

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

// AuthorizeRequests returns the query of every authorization request so far.
func (is *Issuer) AuthorizeRequests() []url.Values {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]url.Values(nil), is.authorizeReqs...)
}

// TokenRequests returns the form of every token request so far.
func (is *Issuer) TokenRequests() []url.Values {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]url.Values(nil), is.tokenReqs...)
}

// RevokeRequests returns the form of every revocation request so far.
func (is *Issuer) RevokeRequests() []url.Values {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]url.Values(nil), is.revokeReqs...)
}

// BeforeRefresh makes f run at the start of each refresh token grant,
// outside the issuer's lock (nil: nothing runs).
func (is *Issuer) BeforeRefresh(f func()) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.beforeRefresh = f
}

// ForgetRefreshTokens makes every refresh token handed out so far invalid.
func (is *Issuer) ForgetRefreshTokens() {
	is.mu.Lock()
	defer is.mu.Unlock()
	clear(is.refresh)
}

// Token signs a bearer token for u with audience aud, valid for
// Options.TokenTTL.
func (is *Issuer) Token(t testing.TB, u User, aud string) string {
	t.Helper()
	tok, err := is.sign(u, aud, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// sign signs a token for u; nonce and scope, when set, become claims.
func (is *Issuer) sign(u User, aud, nonce, scope string) (string, error) {
	now := time.Now()
	claims := map[string]any{"iss": is.URL, "aud": aud, "sub": u.Subject, "iat": now.Unix(),
		"exp": now.Add(is.opts.TokenTTL).Unix(), "preferred_username": u.Subject, "jti": rand.Text(),
		"realm_access": map[string]any{"roles": u.Roles}}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	if scope != "" {
		claims["scope"] = scope
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
	is.mu.Lock()
	is.authorizeReqs = append(is.authorizeReqs, q)
	is.mu.Unlock()
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
	if err := r.ParseForm(); err != nil {
		tokenError(w, "invalid_request")
		return
	}
	f := r.PostForm
	is.mu.Lock()
	is.tokenReqs = append(is.tokenReqs, f)
	hook := is.beforeRefresh
	is.mu.Unlock()
	if hook != nil && f.Get("grant_type") == "refresh_token" {
		hook()
	}
	clientID, secret, basic := r.BasicAuth()
	if !basic {
		clientID, secret = f.Get("client_id"), f.Get("client_secret")
	}
	service := is.opts.ServiceClientID != "" && clientID == is.opts.ServiceClientID
	switch {
	case service && subtle.ConstantTimeCompare([]byte(secret), []byte(is.opts.ServiceSecret)) == 1:
	case clientID == is.clientID && subtle.ConstantTimeCompare([]byte(secret), []byte(is.secret)) == 1:
	default:
		tokenError(w, "invalid_client")
		return
	}
	is.mu.Lock()
	aud := is.audience
	is.mu.Unlock()
	out, errCode := is.grant(f, clientID, service)
	if errCode != "" {
		tokenError(w, errCode)
		return
	}
	u := out.user
	access, err := is.sign(u, aud, "", f.Get("scope"))
	if err != nil {
		tokenError(w, "server_error")
		return
	}
	resp := map[string]any{"access_token": access, "token_type": "Bearer", "expires_in": int64(is.opts.TokenTTL / time.Second)}
	if out.idToken {
		idt, err := is.sign(u, aud, out.nonce, "")
		if err != nil {
			tokenError(w, "server_error")
			return
		}
		resp["id_token"] = idt
	}
	if out.refresh {
		rt := "rt-" + rand.Text()
		is.mu.Lock()
		is.refresh[rt] = u
		is.secrets = append(is.secrets, rt)
		is.mu.Unlock()
		resp["refresh_token"] = rt
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// issue is what a grant hands out: tokens for user, an ID token with
// nonce, a refresh token.
type issue struct {
	user    User
	nonce   string
	idToken bool
	refresh bool
}

// grant checks the grant in token request f of the authenticated client
// clientID (service: the client credentials client) and returns what it
// hands out, or the OAuth error code that refuses it.
func (is *Issuer) grant(f url.Values, clientID string, service bool) (issue, string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	switch f.Get("grant_type") {
	case "authorization_code":
		g, ok := is.codes[f.Get("code")]
		delete(is.codes, f.Get("code")) // one use
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		if !ok || g.redirect != f.Get("redirect_uri") || g.clientID != clientID ||
			base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
			return issue{}, "invalid_grant"
		}
		return issue{user: g.user, nonce: g.nonce, idToken: true, refresh: is.opts.Refresh}, ""
	case "client_credentials":
		if !service {
			return issue{}, "unauthorized_client"
		}
		return issue{user: User{Subject: "service-account-" + clientID, Roles: []string{"openshell-user"}}}, ""
	case "refresh_token":
		u, ok := is.refresh[f.Get("refresh_token")]
		delete(is.refresh, f.Get("refresh_token")) // rotation
		if !ok {
			return issue{}, "invalid_grant"
		}
		return issue{user: u, refresh: true}, ""
	case "urn:ietf:params:oauth:grant-type:device_code":
		polls, ok := is.devices[f.Get("device_code")]
		switch {
		case !ok:
			return issue{}, "invalid_grant"
		case polls == 0:
			is.devices[f.Get("device_code")] = 1
			return issue{}, "authorization_pending"
		}
		delete(is.devices, f.Get("device_code"))
		return issue{user: is.opts.DeviceUser, refresh: is.opts.Refresh}, ""
	}
	return issue{}, "unsupported_grant_type"
}

// device is the device authorization endpoint: every device code is
// approved as Options.DeviceUser after one pending poll.
func (is *Issuer) device(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("client_id") != is.clientID {
		tokenError(w, "invalid_client")
		return
	}
	dc := rand.Text()
	is.mu.Lock()
	is.devices[dc] = 0
	is.secrets = append(is.secrets, dc)
	is.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"device_code": dc, "user_code": "WDJB-MJHT",
		"verification_uri": is.URL + "/activate", "verification_uri_complete": is.URL + "/activate?user_code=WDJB-MJHT",
		"expires_in": 60, "interval": 1})
}

// revoke is the RFC 7009 revocation endpoint: it records the request and
// forgets the token when it is a refresh token.
func (is *Issuer) revoke(_ http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	is.mu.Lock()
	defer is.mu.Unlock()
	is.revokeReqs = append(is.revokeReqs, r.PostForm)
	delete(is.refresh, r.PostForm.Get("token"))
}
