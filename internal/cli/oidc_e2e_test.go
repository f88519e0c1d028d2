package cli

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/auth/oidc/oidctest"
	"github.com/openshell-go/openshell/internal/gatewaytest"
)

// oidcTester starts the test issuer and the real gateway configured to
// accept its tokens, and registers the gateway as "corp" (auth_mode oidc,
// the gateway's CA, scopes "sandbox:read offline_access").
func oidcTester(t *testing.T) (*tester, *oidctest.Issuer, *[]result) {
	t.Helper()
	is := newTestIssuer(t, false, true)
	g := gatewaytest.Start(t, gatewaytest.Options{ExtraArgs: []string{"--oidc-issuer", is.URL, "--oidc-audience", "openshell-cli"}})
	tt := newTester(t)
	var outputs []result
	tt.setup = func(a *app) {
		a.now = time.Now // real tokens, checked by the real gateway
		a.openBrowser = headlessBrowser(t)
	}
	r := tt.run("gateway", "add", "corp", "--endpoint", "https://localhost:"+strings.TrimPrefix(g.Addr, "127.0.0.1:"),
		"--ca", filepath.Join(g.TLSDir, "ca.crt"), "--oidc-issuer", is.URL, "--oidc-scopes", "sandbox:read offline_access")
	if r.err != nil {
		t.Fatalf("gateway add: %v", r.err)
	}
	if !strings.Contains(r.stdout, "Log in with: openshell gateway login corp") {
		t.Errorf("gateway add = %q", r.stdout)
	}
	t.Cleanup(func() {
		// No token or secret may appear in any output, nor in the
		// gateway's log.
		for _, s := range is.Secrets() {
			if strings.Contains(g.Logs(), s) {
				t.Error("a token appeared in the gateway's log")
			}
			for _, o := range outputs {
				if strings.Contains(o.stdout, s) || strings.Contains(o.stderr, s) || (o.err != nil && strings.Contains(o.err.Error(), s)) {
					t.Errorf("a token or secret appeared in the output: stdout %q stderr %q err %v", o.stdout, o.stderr, o.err)
				}
			}
		}
	})
	return tt, is, &outputs
}

func readBundle(t *testing.T, tt *tester, name string) (oidcTokenBundle, os.FileMode) {
	t.Helper()
	path := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", name, "oidc_token.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		switch k {
		case "access_token", "refresh_token", "expires_at", "issuer", "client_id": // OpenShell's keys
		default:
			t.Errorf("oidc_token.json has key %q, which OpenShell's bundle does not", k)
		}
	}
	var tb oidcTokenBundle
	_ = json.Unmarshal(b, &tb)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return tb, st.Mode().Perm()
}

// expireBundle moves the stored token's expires_at into the past, as time
// would.
func expireBundle(t *testing.T, tt *tester, name string) {
	t.Helper()
	path := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", name, "oidc_token.json")
	tb, _ := readBundle(t, tt, name)
	past := time.Now().Add(-time.Minute).Unix()
	tb.ExpiresAt = &past
	b, _ := json.Marshal(tb)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOIDCLoginRealGateway: browser login (authorization code + PKCE, the
// browser being a headless HTTP client following the redirect to the CLI's
// loopback listener), the real gateway accepting the stored token, refresh
// of an expired token resending the login scopes, logout revoking and
// deleting, and the "log in" error afterwards.
func TestOIDCLoginRealGateway(t *testing.T) {
	tt, is, outputs := oidcTester(t)
	run := func(args ...string) result {
		r := tt.run(args...)
		*outputs = append(*outputs, r)
		return r
	}

	if r := run("whoami"); r.err == nil || !strings.Contains(r.err.Error(), "log in with 'openshell gateway login corp'") {
		t.Fatalf("whoami before login = %v", r.err)
	}
	r := run("gateway", "login")
	if r.err != nil || r.stdout != "Logged in to gateway \"corp\" as alice\n" {
		t.Fatalf("gateway login = %q (%v)\nstderr: %s", r.stdout, r.err, r.stderr)
	}
	if !strings.Contains(r.stderr, is.URL+"/authorize?") {
		t.Errorf("login did not print the authorization URL: %q", r.stderr)
	}
	az := is.AuthorizeRequests()[0]
	if az.Get("scope") != "openid sandbox:read offline_access" || az.Get("client_id") != "openshell-cli" || az.Get("prompt") != "" {
		t.Errorf("authorize request = %v", az)
	}
	// The redirect goes to the CLI's loopback listener.
	if u, err := url.Parse(az.Get("redirect_uri")); err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Path != "/callback" {
		t.Errorf("authorize redirect_uri = %q, want http://127.0.0.1:<port>/callback", az.Get("redirect_uri"))
	}
	first, mode := readBundle(t, tt, "corp")
	if mode != 0o600 || first.Issuer != is.URL || first.ClientID != "openshell-cli" || first.RefreshToken == "" || first.ExpiresAt == nil {
		t.Errorf("stored bundle: mode %v issuer %q client %q refresh set %v expiry set %v", mode, first.Issuer, first.ClientID, first.RefreshToken != "", first.ExpiresAt != nil)
	}
	if r := run("whoami"); r.err != nil || !strings.Contains(r.stdout, "alice") {
		t.Fatalf("whoami after login = %q (%v)", r.stdout, r.err)
	}
	if r := run("status"); r.err != nil || !strings.Contains(r.stdout, "Auth:       authenticated (gateway details need the platform_admin role)\n") {
		t.Errorf("status after login = %q (%v)", r.stdout, r.err)
	}

	// An expired token is refreshed before the call, with the login scopes.
	expireBundle(t, tt, "corp")
	if r := run("--debug", "whoami"); r.err != nil || !strings.Contains(r.stdout, "alice") {
		t.Fatalf("whoami with an expired token = %q (%v)\nstderr: %s", r.stdout, r.err, r.stderr)
	}
	req := lastTokenRequest(t, is)
	if req.Get("grant_type") != "refresh_token" || req.Get("scope") != "sandbox:read offline_access" ||
		req.Get("refresh_token") != first.RefreshToken || req.Get("client_id") != "openshell-cli" {
		t.Errorf("refresh request: grant %q scope %q client %q, same refresh token %v", req.Get("grant_type"), req.Get("scope"), req.Get("client_id"), req.Get("refresh_token") == first.RefreshToken)
	}
	second, mode := readBundle(t, tt, "corp")
	if mode != 0o600 || second.AccessToken == first.AccessToken || second.RefreshToken == first.RefreshToken || *second.ExpiresAt <= time.Now().Unix() {
		t.Errorf("refreshed bundle: mode %v, new access %v, rotated refresh %v", mode, second.AccessToken != first.AccessToken, second.RefreshToken != first.RefreshToken)
	}

	// Logout revokes both tokens and deletes the file.
	r = run("gateway", "logout", "corp")
	if r.err != nil || r.stdout != "Logged out of gateway \"corp\" (tokens revoked at the issuer and deleted)\n" {
		t.Fatalf("gateway logout = %q (%v)", r.stdout, r.err)
	}
	var revoked []string
	for _, f := range is.RevokeRequests() {
		revoked = append(revoked, f.Get("token_type_hint"))
		if (f.Get("token_type_hint") == "refresh_token" && f.Get("token") != second.RefreshToken) ||
			(f.Get("token_type_hint") == "access_token" && f.Get("token") != second.AccessToken) {
			t.Errorf("revoked a token other than the stored %s", f.Get("token_type_hint"))
		}
	}
	if strings.Join(revoked, ",") != "refresh_token,access_token" {
		t.Errorf("revocations = %v, want refresh_token,access_token", revoked)
	}
	dir := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", "corp")
	if _, err := os.Stat(filepath.Join(dir, "oidc_token.json")); !os.IsNotExist(err) {
		t.Errorf("oidc_token.json after logout: %v", err)
	}
	if r := run("whoami"); r.err == nil || !strings.Contains(r.err.Error(), "log in with 'openshell gateway login corp'") {
		t.Errorf("whoami after logout = %q (%v)", r.stdout, r.err)
	}
	// The next browser login asks for a fresh login (OpenShell's marker).
	if r := run("gateway", "login", "corp"); r.err != nil {
		t.Fatalf("login after logout: %v", r.err)
	}
	if az := is.AuthorizeRequests(); az[len(az)-1].Get("prompt") != "login" {
		t.Errorf("authorize after logout: prompt = %q, want login", az[len(az)-1].Get("prompt"))
	}
	if _, err := os.Stat(filepath.Join(dir, "oidc_login_prompt_required")); !os.IsNotExist(err) {
		t.Errorf("the fresh-login marker survived a login: %v", err)
	}
}

// TestOIDCClientCredentialsRealGateway: the client credentials grant with
// the secret from OPENSHELL_OIDC_CLIENT_SECRET, a token the real gateway
// accepts, and a new grant instead of a refresh when it expires.
func TestOIDCClientCredentialsRealGateway(t *testing.T) {
	tt, is, outputs := oidcTester(t)
	run := func(args ...string) result {
		r := tt.run(args...)
		*outputs = append(*outputs, r)
		return r
	}
	tt.env[envOIDCClientSecret] = "wrong"
	if r := run("gateway", "login", "corp", "--client-id", "ci-bot"); r.err == nil || !strings.Contains(r.err.Error(), "invalid_client") {
		t.Errorf("login with a wrong secret = %v", r.err)
	}
	tt.env[envOIDCClientSecret] = ciBotSecret
	r := run("gateway", "login", "corp", "--client-id", "ci-bot")
	if r.err != nil || r.stdout != "Logged in to gateway \"corp\" as service-account-ci-bot\n" {
		t.Fatalf("gateway login = %q (%v)\nstderr: %s", r.stdout, r.err, r.stderr)
	}
	req := lastTokenRequest(t, is)
	if req.Get("grant_type") != "client_credentials" || req.Get("scope") != "sandbox:read offline_access" || req.Get("client_id") != "ci-bot" {
		t.Errorf("token request: grant %q scope %q client %q", req.Get("grant_type"), req.Get("scope"), req.Get("client_id"))
	}
	tb, mode := readBundle(t, tt, "corp")
	if mode != 0o600 || tb.ClientID != "ci-bot" || tb.RefreshToken != "" {
		t.Errorf("bundle: mode %v client %q refresh set %v", mode, tb.ClientID, tb.RefreshToken != "")
	}
	if r := run("whoami"); r.err != nil || !strings.Contains(r.stdout, "service-account-ci-bot") {
		t.Fatalf("whoami = %q (%v)", r.stdout, r.err)
	}
	expireBundle(t, tt, "corp")
	if r := run("whoami"); r.err != nil || !strings.Contains(r.stdout, "service-account-ci-bot") {
		t.Fatalf("whoami with an expired token = %q (%v)", r.stdout, r.err)
	}
	if req := lastTokenRequest(t, is); req.Get("grant_type") != "client_credentials" || req.Get("scope") != "sandbox:read offline_access" {
		t.Errorf("renewal request: grant %q scope %q", req.Get("grant_type"), req.Get("scope"))
	}
	// Without the secret, an expired token without refresh token is an
	// error that says to log in.
	expireBundle(t, tt, "corp")
	delete(tt.env, envOIDCClientSecret)
	if r := run("whoami"); r.err == nil || !strings.Contains(r.err.Error(), "there is no refresh token: log in again with 'openshell gateway login corp'") {
		t.Errorf("whoami with an expired token and no secret = %v", r.err)
	}
}
