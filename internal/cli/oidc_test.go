package cli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// addOIDCGateway registers "corp" with auth_mode oidc and issuer.
func addOIDCGateway(t *testing.T, tt *tester, issuer string, extra ...string) {
	t.Helper()
	args := append([]string{"gateway", "add", "corp", "--endpoint", "https://127.0.0.1:1", "--oidc-issuer", issuer}, extra...)
	if r := tt.run(args...); r.err != nil {
		t.Fatalf("gateway add: %v", r.err)
	}
}

func TestGatewayAddOIDC(t *testing.T) {
	tt := newTester(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--endpoint", "http://127.0.0.1:1", "--oidc-issuer", "https://idp"}, "--oidc-issuer needs an https:// endpoint"},
		{[]string{"--endpoint", "https://127.0.0.1:1", "--oidc-scopes", "a"}, "need --oidc-issuer"},
		{[]string{"--endpoint", "https://127.0.0.1:1", "--oidc-issuer", "idp.example"}, `invalid --oidc-issuer "idp.example"`},
	} {
		r := tt.run(append([]string{"gateway", "add", "x"}, tc.args...)...)
		if r.code() != 2 || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("gateway add %v = %v (code %d), want usage error %q", tc.args, r.err, r.code(), tc.want)
		}
	}
	addOIDCGateway(t, tt, "https://idp.example/realms/os", "--oidc-audience", "api", "--oidc-scopes", "a b")
	b, err := os.ReadFile(filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", "corp", "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := parseGatewayMeta(b)
	if err != nil || m.AuthMode != "oidc" || m.OIDCIssuer != "https://idp.example/realms/os" || m.OIDCClientID != "openshell-cli" ||
		m.OIDCAudience != "api" || m.OIDCScopes != "a b" {
		t.Errorf("metadata = %+v (%v)", m, err)
	}
}

func TestGatewayLoginRefusals(t *testing.T) {
	tt := newTester(t)
	if r := tt.run("gateway", "login"); r.code() != 2 || !strings.Contains(r.err.Error(), "no gateway is selected") {
		t.Errorf("login with no gateway = %v", r.err)
	}
	tt.run("gateway", "add", "plain", "--endpoint", "http://127.0.0.1:1")
	if r := tt.run("gateway", "login", "plain"); r.err == nil || r.err.Error() != `gateway "plain" uses plaintext authentication, not OIDC: only OIDC gateways support login` {
		t.Errorf("login to a plaintext gateway = %v", r.err)
	}
	if r := tt.run("gateway", "logout", "plain"); r.err == nil || r.err.Error() != `gateway "plain" uses plaintext authentication: there are no stored credentials to clear` {
		t.Errorf("logout of a plaintext gateway = %v", r.err)
	}
	if r := tt.run("gateway", "login", "nope"); r.err == nil || !strings.Contains(r.err.Error(), `gateway "nope" is not registered`) {
		t.Errorf("login to an unknown gateway = %v", r.err)
	}
}

// TestOIDCDeviceLogin: with --no-browser and an issuer that offers device
// authorization, login prints where to approve and polls until approved.
func TestOIDCDeviceLogin(t *testing.T) {
	is := newTestIssuer(t, true, false)
	tt := newTester(t)
	tt.setup = func(a *app) {
		a.now = time.Now
		a.openBrowser = func(string) error { t.Error("a browser was opened despite --no-browser"); return nil }
	}
	addOIDCGateway(t, tt, is.URL, "--oidc-scopes", "sandbox:read")
	r := tt.run("gateway", "login", "--no-browser")
	if r.err != nil || r.stdout != "Logged in to gateway \"corp\" as dave\n" {
		t.Fatalf("login = %q (%v)\nstderr: %s", r.stdout, r.err, r.stderr)
	}
	if !strings.Contains(r.stderr, is.URL+"/activate?user_code=WDJB-MJHT") {
		t.Errorf("login did not print the verification URL: %q", r.stderr)
	}
	var grants []string
	for _, f := range is.TokenRequests() {
		grants = append(grants, f.Get("grant_type"))
	}
	if len(grants) != 2 || grants[1] != "urn:ietf:params:oauth:grant-type:device_code" {
		t.Errorf("token requests = %v, want a pending poll and a successful one", grants)
	}
	tb, mode := readBundle(t, tt, "corp")
	if mode != 0o600 || tb.RefreshToken == "" {
		t.Errorf("bundle: mode %v, refresh set %v", mode, tb.RefreshToken != "")
	}
	for _, s := range is.Secrets() {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Error("a token appeared in the output")
		}
	}

	// Logout against an issuer without a revocation endpoint deletes only.
	r = tt.run("gateway", "logout")
	if r.err != nil || r.stdout != "Logged out of gateway \"corp\" (tokens deleted; the issuer offers no revocation endpoint)\n" {
		t.Errorf("logout = %q (%v)", r.stdout, r.err)
	}
}

// TestOIDCLogoutIssuerDown: logout deletes the tokens even when the issuer
// cannot be reached, and says so. The issuer is registered with a trailing
// slash its discovery document does not have, which OpenShell accepts.
func TestOIDCLogoutIssuerDown(t *testing.T) {
	is := newTestIssuer(t, false, true)
	tt := newTester(t)
	tt.setup = func(a *app) { a.now = time.Now; a.openBrowser = headlessBrowser(t) }
	addOIDCGateway(t, tt, is.URL+"/")
	if r := tt.run("gateway", "login"); r.err != nil {
		t.Fatalf("login: %v\n%s", r.err, r.stderr)
	}
	is.Close()
	r := tt.run("gateway", "logout")
	if r.err != nil || r.stdout != "Logged out of gateway \"corp\" (tokens deleted locally; revocation failed)\n" ||
		!strings.Contains(r.stderr, "warning: could not revoke the tokens at the issuer") {
		t.Errorf("logout = %q %q (%v)", r.stdout, r.stderr, r.err)
	}
	if _, err := os.Stat(filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", "corp", "oidc_token.json")); !os.IsNotExist(err) {
		t.Errorf("token file after logout: %v", err)
	}
}

// TestOIDCRefreshRefused: an issuer that refuses the refresh token makes
// the command fail with the issuer's error code and the login hint.
func TestOIDCRefreshRefused(t *testing.T) {
	is := newTestIssuer(t, false, true)
	tt := newTester(t)
	tt.setup = func(a *app) { a.now = time.Now; a.openBrowser = headlessBrowser(t) }
	addOIDCGateway(t, tt, is.URL)
	if r := tt.run("gateway", "login"); r.err != nil {
		t.Fatalf("login: %v\n%s", r.err, r.stderr)
	}
	is.ForgetRefreshTokens()
	expireBundle(t, tt, "corp")
	r := tt.run("sandbox", "list")
	if r.err == nil || !strings.Contains(r.err.Error(), "could not be refreshed: the token endpoint refused the request: invalid_grant; log in again with 'openshell gateway login corp'") {
		t.Errorf("sandbox list = %v", r.err)
	}
}

// TestOIDCCallback: the loopback redirect handler accepts one redirect
// with the right state and refuses the rest.
func TestOIDCCallback(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		wantStatus  int
		wantErr     string
	}{
		{"ok", "code=c1&state=s", http.StatusOK, ""},
		{"wrong state", "code=c1&state=x", http.StatusBadRequest, "wrong state"},
		{"no code", "state=s", http.StatusBadRequest, "no authorization code"},
		{"provider error", "error=access_denied&error_description=%3Cb%3Eno%3C%2Fb%3E&state=s", http.StatusBadRequest, "refused the login: access_denied <b>no</b>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := &oidcCallback{state: "s", done: make(chan struct{})}
			w := httptest.NewRecorder()
			cb.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/callback?"+tc.query, nil))
			if w.Code != tc.wantStatus || strings.Contains(w.Body.String(), "<b>no") {
				t.Errorf("status %d body %q", w.Code, w.Body.String())
			}
			<-cb.done
			if (cb.err == nil) != (tc.wantErr == "") || (cb.err != nil && !strings.Contains(cb.err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", cb.err, tc.wantErr)
			}
			if tc.wantErr == "" && cb.code != "c1" {
				t.Errorf("code = %q", cb.code)
			}
			w = httptest.NewRecorder()
			cb.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/callback?code=c2&state=s", nil))
			if w.Code != http.StatusConflict || (tc.wantErr == "" && cb.code != "c1") {
				t.Errorf("second redirect: status %d, code %q", w.Code, cb.code)
			}
		})
	}
}

// TestGatewayLoginCompletion: login and logout complete gateway names.
func TestGatewayLoginCompletion(t *testing.T) {
	tt := newTester(t)
	addOIDCGateway(t, tt, "https://idp.example")
	for _, verb := range []string{"login", "logout"} {
		r := tt.run("__complete", "gateway", verb, "c")
		if got, _, _ := strings.Cut(r.stdout, "Completion ended"); r.err != nil || got != "corp\n:4\n" {
			t.Errorf("__complete gateway %s c = %q (%v)", verb, r.stdout, r.err)
		}
	}
}

// TestOIDCConcurrentRefresh: two openshell processes that find the same
// expired token refresh it once; the second uses what the first stored.
// The issuer rotates refresh tokens, so a second refresh with the same
// token would be refused.
func TestOIDCConcurrentRefresh(t *testing.T) {
	is := newTestIssuer(t, false, true)
	tt := newTester(t)
	tt.setup = func(a *app) { a.now = time.Now; a.openBrowser = headlessBrowser(t) }
	addOIDCGateway(t, tt, is.URL)
	if r := tt.run("gateway", "login"); r.err != nil {
		t.Fatalf("login: %v\n%s", r.err, r.stderr)
	}
	expireBundle(t, tt, "corp")
	var refreshes atomic.Int32
	second := make(chan struct{})
	is.BeforeRefresh(func() {
		if refreshes.Add(1) == 1 {
			// Hold the first refresh until a second one arrives; with the
			// lock none does, and the first goes on after 2 s.
			select {
			case <-second:
			case <-time.After(2 * time.Second):
			}
			return
		}
		close(second)
	})
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i := range results {
		wg.Go(func() { results[i] = tt.run("gateway", "info") })
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || !strings.Contains(r.stdout, "OIDC access token from") {
			t.Errorf("run %d: %q (%v)", i, r.stdout, r.err)
		}
	}
	if n := refreshes.Load(); n != 1 {
		t.Errorf("%d refresh requests, want 1", n)
	}
}

// urlOpener is a user watching stderr: it opens the first authorization
// URL printed there in the headless browser.
type urlOpener struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    strings.Builder
	opened bool
	wg     sync.WaitGroup
}

func (u *urlOpener) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.buf.Write(p)
	if !u.opened {
		for _, f := range strings.Fields(u.buf.String()) {
			if strings.HasPrefix(f, u.prefix) {
				u.opened = true
				u.wg.Go(func() { _ = headlessBrowser(u.t)(f) })
				break
			}
		}
	}
	return len(p), nil
}

// TestOIDCLoginNoBrowserPrintsURL: with --no-browser and an issuer without
// device authorization, login prints the authorization URL, opens no
// browser, and completes when the user opens the URL.
func TestOIDCLoginNoBrowserPrintsURL(t *testing.T) {
	is := newTestIssuer(t, false, false)
	tt := newTester(t)
	watcher := &urlOpener{t: t, prefix: is.URL + "/authorize?"}
	addOIDCGateway(t, tt, is.URL)
	tt.setup = func(a *app) {
		a.now = time.Now
		a.openBrowser = func(string) error { t.Error("a browser was opened despite --no-browser"); return nil }
		a.stderr = watcher
	}
	r := tt.run("gateway", "login", "--no-browser")
	watcher.wg.Wait()
	if r.err != nil || r.stdout != "Logged in to gateway \"corp\" as alice\n" {
		t.Fatalf("login = %q (%v)\nstderr: %s", r.stdout, r.err, watcher.buf.String())
	}
	if !watcher.opened {
		t.Error("no authorization URL was printed")
	}
}
