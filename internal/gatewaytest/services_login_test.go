package gatewaytest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth/oidc/oidctest"
)

// bearer is gRPC per-RPC credentials carrying an OIDC token.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// bearerClient returns an OpenShell client authenticating with tok over
// TLS without a client certificate.
func (g *Gateway) bearerClient(t *testing.T, tok string) openshellv1.OpenShellClient {
	t.Helper()
	tc := g.clientTLS()
	tc.Certificates = nil
	conn, err := grpc.NewClient(g.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)), grpc.WithPerRPCCredentials(bearer(tok)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return openshellv1.NewOpenShellClient(conn)
}

// browser is an HTTP client with a cookie jar that reaches service hosts
// (*.openshell.localhost) at the gateway and everything else (the
// issuer) directly, and sends the headers of a browser's navigation. It
// follows no redirect by itself, so each hop can be checked.
type browser struct {
	t  *testing.T
	c  *http.Client
	tr *http.Transport
}

func (g *Gateway) newBrowser(t *testing.T, tlsConf *tls.Config) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{TLSClientConfig: tlsConf, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h, _, _ := net.SplitHostPort(addr); strings.HasSuffix(h, ".openshell.localhost") {
			addr = g.Addr
		}
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{t: t, tr: tr, c: &http.Client{Jar: jar, Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// answer is what one request got.
type answer struct {
	StatusCode int
	Header     http.Header
}

// get sends one request; mode is the Sec-Fetch-Mode ("navigate" for a
// page load, "cors" for a script's fetch).
func (b *browser) get(rawURL, mode string) (*answer, string) {
	b.t.Helper()
	return b.do(http.MethodGet, rawURL, map[string]string{"Sec-Fetch-Mode": mode})
}

// do sends one request with hdr (and Accept: text/html).
func (b *browser) do(method, rawURL string, hdr map[string]string) (*answer, string) {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), method, rawURL, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	req.Header.Set("Accept", "text/html")
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return &answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
}

var metaRefresh = regexp.MustCompile(`content="0;url=([^"]+)"`)

// login opens pageURL and follows the login to its end: the redirect to
// the issuer, the issuer's redirect to the callback, and the callback's
// redirect (TLS) or continue page (plaintext). It returns the callback's
// answer and the last answer.
func (b *browser) login(pageURL string) (callback, last *answer, body string) {
	b.t.Helper()
	resp, _ := b.get(pageURL, "navigate")
	if resp.StatusCode != http.StatusFound {
		b.t.Fatalf("GET %s without identity = %d, want 302 to the issuer", pageURL, resp.StatusCode)
	}
	resp, _ = b.get(resp.Header.Get("Location"), "navigate") // the issuer approves at once
	if resp.StatusCode != http.StatusFound {
		b.t.Fatalf("issuer authorize = %d, want 302 to the callback", resp.StatusCode)
	}
	callback, body = b.get(resp.Header.Get("Location"), "navigate")
	next := ""
	switch {
	case callback.StatusCode == http.StatusSeeOther:
		next = callback.Header.Get("Location")
	case callback.StatusCode == http.StatusOK && metaRefresh.MatchString(body):
		next = metaRefresh.FindStringSubmatch(body)[1]
	default:
		return callback, callback, body
	}
	base, _ := url.Parse(pageURL)
	ref, err := url.Parse(next)
	if err != nil {
		b.t.Fatal(err)
	}
	last, body = b.get(base.ResolveReference(ref).String(), "navigate")
	return callback, last, body
}

// setCookie returns the Set-Cookie header of resp naming name.
func setCookie(resp *answer, name string) string {
	for _, v := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(v, name+"=") {
			return v
		}
	}
	return ""
}

func cookieValue(sc string) string {
	v, _, _ := strings.Cut(strings.SplitN(sc, "=", 2)[1], ";")
	return v
}

// TestServiceOIDCLogin logs a browser in to a sandbox's app through the
// gateway's OIDC login (authorization code + PKCE against a real issuer
// on loopback), over the loopback plaintext path and over TLS, and tries
// the ways around it: script requests, forged and replayed cookies, a
// mismatched state, a user outside the sandbox's workspace, an ID token
// for another audience.
func TestServiceOIDCLogin(t *testing.T) {
	secret := "login-secret-" + rand.Text()
	is := oidctest.New(t, "openshell-cli", secret)
	secretFile := filepath.Join(TempDir(t), "login-client-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--oidc-issuer", is.URL, "--oidc-login-client-id", "openshell-cli", "--oidc-login-client-secret-file", secretFile}
	g := Start(t, Options{ExtraArgs: args})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	adminTok := is.Token(t, oidctest.User{Subject: "root", Roles: []string{"openshell-admin", "openshell-user"}}, "openshell-cli")
	c := g.bearerClient(t, adminTok)
	alice := oidctest.User{Subject: "alice", Roles: []string{"openshell-user"}}
	bob := oidctest.User{Subject: "bob", Roles: []string{"openshell-user"}}
	if _, err := c.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "default", PrincipalSubject: alice.Subject,
		Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER}); err != nil {
		t.Fatal(err)
	}

	port := freePort(t)
	sb := readySandbox(ctx, t, c, "web", HelperCommand("http", strconv.Itoa(port))...)
	g.InstallHelper(t, sb.GetMetadata().GetId())
	var pageURL, otherURL string
	for svc, u := range map[string]*string{"app": &pageURL, "other": &otherURL} {
		resp, err := c.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "web", Service: svc, TargetPort: uint32(port)})
		if err != nil {
			t.Fatal(err)
		}
		*u = resp.GetUrl()
	}
	if want := fmt.Sprintf("http://web--app.openshell.localhost:%d/", g.Port); pageURL != want {
		t.Fatalf("service URL = %q, want %q", pageURL, want)
	}
	// The app starts with the sandbox: poll with a bearer token (which
	// also proves bearer tokens still open service URLs).
	probe := g.serviceClient(nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, _, err := fetch(t, probe, pageURL, map[string]string{"Authorization": "Bearer " + adminTok})
		if err == nil && r.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s never answered 200 to a bearer token: %v %v", pageURL, r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(pageURL, "http://"), "/")
	is.SetUser(alice)
	var sessions []string

	t.Run("script request without identity is 401", func(t *testing.T) {
		b := g.newBrowser(t, nil)
		resp, body := b.get(pageURL, "cors")
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "sandbox app") {
			t.Fatalf("fetch without identity = %d %q, want 401", resp.StatusCode, body)
		}
	})
	t.Run("plaintext login", func(t *testing.T) {
		b := g.newBrowser(t, nil)
		first, _ := b.get(pageURL+"headers?x=1", "navigate")
		loc, _ := url.Parse(first.Header.Get("Location"))
		state := setCookie(first, "openshell-login")
		if first.StatusCode != http.StatusFound || !strings.HasPrefix(loc.String(), is.URL+"/authorize?") ||
			loc.Query().Get("redirect_uri") != "http://"+host+"/.openshell/oidc/callback" || loc.Query().Get("code_challenge") == "" {
			t.Fatalf("navigation without identity = %d to %q, want 302 to the issuer with PKCE and the host's callback", first.StatusCode, loc)
		}
		for _, want := range []string{"Path=/", "HttpOnly", "SameSite=Lax", "Max-Age=600"} {
			if !strings.Contains(state, want) {
				t.Errorf("login state cookie %q lacks %s", state, want)
			}
		}
		b = g.newBrowser(t, nil)
		cb, last, body := b.login(pageURL + "headers?x=1")
		sc := setCookie(cb, "openshell-session")
		if cb.StatusCode != http.StatusOK || sc == "" {
			t.Fatalf("callback = %d (Set-Cookie %q), want the continue page and a session cookie", cb.StatusCode, cb.Header.Values("Set-Cookie"))
		}
		for _, want := range []string{"Path=/", "HttpOnly", "SameSite=Lax"} {
			if !strings.Contains(sc, want) {
				t.Errorf("session cookie %q lacks %s", sc, want)
			}
		}
		if strings.Contains(sc, "Domain=") || strings.Contains(sc, "Secure") {
			t.Errorf("plaintext session cookie %q: want host-only and not Secure", sc)
		}
		if last.StatusCode != http.StatusOK || !strings.Contains(body, "host=127.0.0.1:") {
			t.Fatalf("after login GET /headers?x=1 = %d %q, want the app", last.StatusCode, body)
		}
		if !strings.Contains(body, `cookie=""`) {
			t.Errorf("the app saw the gateway's cookies: %q", body)
		}
		sessions = append(sessions, cookieValue(sc))

		// Script requests of the logged-in page pass too.
		if resp, body := b.get(pageURL, "cors"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Errorf("fetch with the session = %d, want the app", resp.StatusCode)
		}
		// Logout clears the session: the next navigation logs in again.
		out, _ := b.get(pageURL+".openshell/oidc/logout", "navigate")
		if out.StatusCode != http.StatusOK || !strings.Contains(setCookie(out, "openshell-session"), "Max-Age=0") {
			t.Errorf("logout = %d %q, want 200 clearing the session cookie", out.StatusCode, out.Header.Values("Set-Cookie"))
		}
		if resp, _ := b.get(pageURL, "navigate"); resp.StatusCode != http.StatusFound {
			t.Errorf("navigation after logout = %d, want 302 to the issuer", resp.StatusCode)
		}
	})
	t.Run("tls login", func(t *testing.T) {
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(filepath.Join(g.TLSDir, "ca.crt"))
		if err != nil || !pool.AppendCertsFromPEM(ca) {
			t.Fatalf("ca: %v", err)
		}
		b := g.newBrowser(t, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		tlsURL := "https://" + host + "/"
		cb, last, body := b.login(tlsURL)
		sc := setCookie(cb, "__Host-openshell-session")
		if cb.StatusCode != http.StatusSeeOther || cb.Header.Get("Location") != "/" || sc == "" {
			t.Fatalf("TLS callback = %d to %q (Set-Cookie %q), want 303 to / with a __Host- session cookie",
				cb.StatusCode, cb.Header.Get("Location"), cb.Header.Values("Set-Cookie"))
		}
		for _, want := range []string{"Path=/", "HttpOnly", "Secure", "SameSite=Lax"} {
			if !strings.Contains(sc, want) {
				t.Errorf("session cookie %q lacks %s", sc, want)
			}
		}
		if last.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Fatalf("after TLS login GET / = %d %q, want the app", last.StatusCode, body)
		}
		sessions = append(sessions, cookieValue(sc))

		// SameSite=Lax cookies also go with requests from sibling hosts
		// (another sandbox's app is the same site): only plain page
		// loads may use the session from there.
		sibling := map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}
		if resp, body := b.do(http.MethodGet, tlsURL, sibling); resp.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Errorf("link from a sibling app = %d, want the app", resp.StatusCode)
		}
		for name, req := range map[string]struct {
			method string
			hdr    map[string]string
		}{
			"sibling fetch":     {http.MethodGet, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}},
			"sibling form post": {http.MethodPost, sibling},
			"foreign origin":    {http.MethodPost, map[string]string{"Origin": "https://web--other.openshell.localhost"}},
		} {
			if resp, body := b.do(req.method, tlsURL, req.hdr); resp.StatusCode != http.StatusForbidden || strings.Contains(body, "sandbox app") {
				t.Errorf("%s with the session = %d %q, want 403", name, resp.StatusCode, body)
			}
		}
	})
	if len(sessions) == 0 {
		t.Fatal("no session to attack")
	}
	sess := sessions[0]
	withCookie := func(t *testing.T, target, cookie, mode string) (*answer, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, target, nil)
		req.Header.Set("Cookie", cookie)
		req.Header.Set("Sec-Fetch-Mode", mode)
		resp, err := (&http.Client{Transport: probe.Transport, Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return &answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
	}
	t.Run("session cookie works alone", func(t *testing.T) {
		if resp, body := withCookie(t, pageURL, "openshell-session="+sess, "navigate"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Fatalf("GET with the session cookie = %d, want the app", resp.StatusCode)
		}
	})
	t.Run("forged cookie is 401", func(t *testing.T) {
		forged := []byte(sess)
		i := len(forged) / 2
		forged[i] = map[bool]byte{true: 'B', false: 'A'}[forged[i] == 'A']
		for _, v := range []string{string(forged), "x" + sess, "garbage"} {
			resp, body := withCookie(t, pageURL, "openshell-session="+v, "navigate")
			if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "sandbox app") {
				t.Errorf("GET with a forged session cookie = %d %q, want 401", resp.StatusCode, body)
			}
		}
	})
	t.Run("cookie replayed on another host is refused", func(t *testing.T) {
		resp, body := withCookie(t, otherURL, "openshell-session="+sess, "cors")
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "sandbox app") {
			t.Errorf("session of %s on %s = %d, want 401", host, otherURL, resp.StatusCode)
		}
		if len(sessions) > 1 { // the TLS session on the plaintext path: another cookie name, another host string
			if resp, _ := withCookie(t, pageURL, "openshell-session="+sessions[1], "cors"); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("TLS session on the plaintext path = %d, want 401", resp.StatusCode)
			}
		}
	})
	t.Run("state mismatch is 400", func(t *testing.T) {
		b := g.newBrowser(t, nil)
		first, _ := b.get(pageURL, "navigate")
		issuerResp, _ := b.get(first.Header.Get("Location"), "navigate")
		cb, err := url.Parse(issuerResp.Header.Get("Location"))
		if err != nil {
			t.Fatal(err)
		}
		q := cb.Query()
		q.Set("state", "forged-"+q.Get("state"))
		cb.RawQuery = q.Encode()
		resp, body := b.get(cb.String(), "navigate")
		if resp.StatusCode != http.StatusBadRequest || setCookie(resp, "openshell-session") != "" {
			t.Errorf("callback with another state = %d %q, want 400 and no session", resp.StatusCode, body)
		}
		// Without the login state cookie at all (a login started elsewhere).
		resp, _ = g.newBrowser(t, nil).get(cb.String(), "navigate")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("callback without login state = %d, want 400", resp.StatusCode)
		}
	})
	t.Run("user outside the workspace is 403", func(t *testing.T) {
		is.SetUser(bob)
		defer is.SetUser(alice)
		cb, last, body := g.newBrowser(t, nil).login(pageURL)
		if setCookie(cb, "openshell-session") == "" || last.StatusCode != http.StatusForbidden || strings.Contains(body, "sandbox app") {
			t.Errorf("bob after login = %d %q, want a session and then 403", last.StatusCode, body)
		}
	})
	t.Run("id token for another audience is refused", func(t *testing.T) {
		is.SetAudience("another-client")
		defer is.SetAudience("openshell-cli")
		cb, _, body := g.newBrowser(t, nil).login(pageURL)
		if cb.StatusCode != http.StatusUnauthorized || setCookie(cb, "openshell-session") != "" {
			t.Errorf("callback with a wrong-audience ID token = %d %q, want 401 and no session", cb.StatusCode, body)
		}
	})
	t.Run("headless chromium", func(t *testing.T) {
		// A real browser through the whole login: the redirects, the
		// login cookie across the issuer's site, the continue page on
		// the plaintext path (whose next request must pass the
		// cross-origin checks), and the app's script.
		chromiumDOM(t, pageURL)
		chromiumDOM(t, "https://"+host+"/", "--ignore-certificate-errors")
	})
	logs := ""
	t.Run("session survives a gateway restart", func(t *testing.T) {
		// The sealing key comes from the credentials KEK in the state
		// directory, so the restarted gateway (like another replica
		// with the same KEK) accepts the session. Its sandbox may not
		// be back yet: the answer only has to be past authentication.
		logs += g.Logs()
		g.Stop()
		g2 := Start(t, Options{ExtraArgs: args, StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
		t.Cleanup(func() { logs += g2.Logs() })
		probe.CloseIdleConnections()
		resp, body := withCookie(t, pageURL, "openshell-session="+sess, "navigate")
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusFound {
			t.Errorf("session after a restart = %d %q, want it accepted", resp.StatusCode, body)
		}
		if resp, _ := withCookie(t, pageURL, "openshell-session=x"+sess, "navigate"); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("forged session after a restart = %d, want 401", resp.StatusCode)
		}
		logs += g2.Logs()
	})
	t.Run("no secret in the logs", func(t *testing.T) {
		logs += g.Logs()
		for _, s := range append(is.Secrets(), sessions...) {
			if strings.Contains(logs, s) {
				t.Errorf("gateway log contains a secret, code, token or session (%d bytes)", len(s))
			}
		}
		if !strings.Contains(logs, "service login") {
			t.Errorf("gateway log has no service login record")
		}
	})
}
