package cli

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// testIssuer is a small OpenID provider on loopback for login tests:
// discovery, JWKS, authorize (auto-approves, PKCE S256 only), token
// (authorization_code, client_credentials, refresh_token with rotation,
// device_code), device authorization and RFC 7009 revocation. Access
// tokens are RS256 JWTs signed with go-jose, so the real gateway verifies
// them. It records every request for the tests to inspect.
type testIssuer struct {
	srv          *httptest.Server
	key          *rsa.PrivateKey
	clientSecret string // of the confidential client "ci-bot"
	expiresIn    int64

	mu        sync.Mutex
	codes     map[string]issuedCode
	refresh   map[string]string // refresh token -> subject
	devices   map[string]int    // device code -> polls so far
	authorize []url.Values      // query of each authorize request
	tokenReqs []url.Values      // form of each token request
	revoked   []url.Values      // form of each revocation request
	issued    []string          // every token handed out
	// beforeRefresh, when set, runs at the start of each refresh_token
	// grant, outside mu.
	beforeRefresh func()
}

type issuedCode struct {
	challenge, redirect, clientID string
}

func newTestIssuer(t testing.TB, device, revocation bool) *testIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &testIssuer{key: key, clientSecret: "ci-secret-" + rand.Text(), expiresIn: 300,
		codes: map[string]issuedCode{}, refresh: map[string]string{}, devices: map[string]int{}}
	mux := http.NewServeMux()
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		doc := map[string]any{"issuer": is.srv.URL, "authorization_endpoint": is.srv.URL + "/authorize",
			"token_endpoint": is.srv.URL + "/token", "jwks_uri": is.srv.URL + "/keys",
			"id_token_signing_alg_values_supported": []string{"RS256"}, "code_challenge_methods_supported": []string{"S256"}}
		if device {
			doc["device_authorization_endpoint"] = is.srv.URL + "/device"
		}
		if revocation {
			doc["revocation_endpoint"] = is.srv.URL + "/revoke"
		}
		_ = json.NewEncoder(w).Encode(doc)
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", is.handleAuthorize)
	mux.HandleFunc("POST /token", is.handleToken)
	mux.HandleFunc("POST /device", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		dc := rand.Text()
		is.mu.Lock()
		is.devices[dc] = 0
		is.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"device_code": dc, "user_code": "WDJB-MJHT",
			"verification_uri": is.srv.URL + "/activate", "verification_uri_complete": is.srv.URL + "/activate?user_code=WDJB-MJHT",
			"expires_in": 60, "interval": 1})
	})
	mux.HandleFunc("POST /revoke", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		is.mu.Lock()
		defer is.mu.Unlock()
		is.revoked = append(is.revoked, r.PostForm)
		delete(is.refresh, r.PostForm.Get("token"))
	})
	return is
}

func (is *testIssuer) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	is.mu.Lock()
	is.authorize = append(is.authorize, q)
	is.mu.Unlock()
	redirect, err := url.Parse(q.Get("redirect_uri"))
	if err != nil || redirect.Scheme != "http" || redirect.Hostname() != "127.0.0.1" || redirect.Path != "/callback" {
		http.Error(w, "redirect_uri must be a loopback callback", http.StatusBadRequest)
		return
	}
	if q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" {
		http.Error(w, "authorization code with PKCE S256 only", http.StatusBadRequest)
		return
	}
	code := rand.Text()
	is.mu.Lock()
	is.codes[code] = issuedCode{challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri"), clientID: q.Get("client_id")}
	is.mu.Unlock()
	v := url.Values{"code": {code}, "state": {q.Get("state")}}
	http.Redirect(w, r, redirect.String()+"?"+v.Encode(), http.StatusFound)
}

func tokenError(w http.ResponseWriter, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

func (is *testIssuer) handleToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		tokenError(w, "invalid_request")
		return
	}
	f := r.PostForm
	is.mu.Lock()
	hook := is.beforeRefresh
	is.mu.Unlock()
	if hook != nil && f.Get("grant_type") == "refresh_token" {
		hook()
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.tokenReqs = append(is.tokenReqs, f)
	var subject string
	withRefresh := true
	switch f.Get("grant_type") {
	case "authorization_code":
		c, ok := is.codes[f.Get("code")]
		delete(is.codes, f.Get("code"))
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		if !ok || c.redirect != f.Get("redirect_uri") || c.clientID != f.Get("client_id") ||
			base64.RawURLEncoding.EncodeToString(sum[:]) != c.challenge {
			tokenError(w, "invalid_grant")
			return
		}
		subject = "alice"
	case "client_credentials":
		if f.Get("client_id") != "ci-bot" || f.Get("client_secret") != is.clientSecret {
			tokenError(w, "invalid_client")
			return
		}
		subject, withRefresh = "service-account-ci-bot", false
	case "refresh_token":
		s, ok := is.refresh[f.Get("refresh_token")]
		if !ok {
			tokenError(w, "invalid_grant")
			return
		}
		delete(is.refresh, f.Get("refresh_token")) // rotation
		subject = s
	case "urn:ietf:params:oauth:grant-type:device_code":
		polls, ok := is.devices[f.Get("device_code")]
		if !ok {
			tokenError(w, "invalid_grant")
			return
		}
		is.devices[f.Get("device_code")] = polls + 1
		if polls == 0 {
			tokenError(w, "authorization_pending")
			return
		}
		delete(is.devices, f.Get("device_code"))
		subject = "dave"
	default:
		tokenError(w, "unsupported_grant_type")
		return
	}
	now := time.Now()
	claims := map[string]any{"iss": is.srv.URL, "aud": "openshell-cli", "sub": subject, "iat": now.Unix(),
		"exp": now.Add(time.Duration(is.expiresIn) * time.Second).Unix(), "preferred_username": subject,
		"realm_access": map[string]any{"roles": []string{"openshell-user"}}, "scope": f.Get("scope"), "jti": rand.Text()}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: is.key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	if err != nil {
		tokenError(w, "server_error")
		return
	}
	access, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		tokenError(w, "server_error")
		return
	}
	resp := map[string]any{"access_token": access, "token_type": "Bearer", "expires_in": is.expiresIn}
	is.issued = append(is.issued, access)
	if withRefresh {
		rt := "rt-" + rand.Text()
		is.refresh[rt] = subject
		is.issued = append(is.issued, rt)
		resp["refresh_token"] = rt
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// lastTokenRequest returns the form of the latest token request.
func (is *testIssuer) lastTokenRequest(t testing.TB) url.Values {
	t.Helper()
	is.mu.Lock()
	defer is.mu.Unlock()
	if len(is.tokenReqs) == 0 {
		t.Fatal("the issuer saw no token request")
	}
	return is.tokenReqs[len(is.tokenReqs)-1]
}

// secrets are every token and secret the issuer handed out.
func (is *testIssuer) secrets() []string {
	is.mu.Lock()
	defer is.mu.Unlock()
	return append([]string{is.clientSecret}, is.issued...)
}

// headlessBrowser is a browser for 'gateway login': it follows the
// authorize redirect to the CLI's loopback listener and checks the page.
func headlessBrowser(t testing.TB) func(string) error {
	return func(u string) error {
		resp, err := http.Get(u) //nolint:gosec,noctx // the URL the CLI printed, on loopback
		if err != nil {
			t.Errorf("browser: %v", err)
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Request.URL.String(), "http://127.0.0.1:") {
			t.Errorf("browser ended at %s with %s", resp.Request.URL, resp.Status)
		}
		return nil
	}
}
