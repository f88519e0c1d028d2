package cli

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	gooidc "github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// OIDC login, refresh and logout for gateways with auth_mode "oidc", as
// OpenShell's CLI does them (crates/openshell-cli/src/oidc_auth.rs):
//
//   - OPENSHELL_OIDC_CLIENT_SECRET set: the client credentials grant with
//     the scopes of metadata.json's oidc_scopes (no "openid" added).
//   - --no-browser (or OPENSHELL_NO_BROWSER=1|true) and an issuer that
//     advertises device_authorization_endpoint: the device authorization
//     grant (RFC 8628).
//   - Otherwise: authorization code + PKCE (S256) with a redirect to
//     http://127.0.0.1:PORT/callback; the URL is printed, and opened in a
//     browser unless --no-browser.
//
// Tokens go to gateways/<name>/oidc_token.json (0600) in OpenShell's keys.
// A token that expires within 30 seconds is refreshed before a call with
// the refresh_token grant, resending oidc_scopes.

const (
	oidcDefaultClientID = "openshell-cli"
	// oidcExpiryMargin is OpenShell's rule: a token is expired 30 s before
	// expires_at.
	oidcExpiryMargin = 30 * time.Second
	// oidcLoginTimeout bounds the wait for the browser redirect (OpenShell:
	// 120 s).
	oidcLoginTimeout = 120 * time.Second
	// envOIDCClientSecret selects the client credentials grant; the secret
	// is read from the environment only, never from the command line.
	envOIDCClientSecret = "OPENSHELL_OIDC_CLIENT_SECRET"
	envNoBrowser        = "OPENSHELL_NO_BROWSER"
)

// oidcEndpoints are the endpoints of an issuer's discovery document.
type oidcEndpoints struct {
	Auth, Token, Device, Revocation string
}

// oidcHTTPClient talks to the identity provider: system roots (or no
// verification with --gateway-insecure, as OpenShell's CLI), no redirects
// followed, a bounded time per request.
func oidcHTTPClient(insecure bool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if insecure {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // explicit user choice
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// discoverOIDC reads the issuer's discovery document; go-oidc checks that
// its issuer is the one configured (without a trailing slash, which
// OpenShell's CLI ignores on both sides).
func discoverOIDC(ctx context.Context, hc *http.Client, issuer string) (oidcEndpoints, error) {
	p, err := gooidc.NewProvider(gooidc.ClientContext(ctx, hc), strings.TrimSuffix(issuer, "/"))
	if err != nil {
		return oidcEndpoints{}, fmt.Errorf("OIDC discovery of %s: %w", issuer, err)
	}
	var extra struct {
		Revocation string `json:"revocation_endpoint"`
	}
	_ = p.Claims(&extra)
	ep := p.Endpoint()
	return oidcEndpoints{Auth: ep.AuthURL, Token: ep.TokenURL, Device: ep.DeviceAuthURL, Revocation: extra.Revocation}, nil
}

// interactiveScopes are the scopes of the browser and device flows:
// "openid" plus oidc_scopes (OpenShell's build_scopes).
func interactiveScopes(scopes string) []string {
	out := []string{"openid"}
	for _, s := range strings.Fields(scopes) {
		if s != "openid" {
			out = append(out, s)
		}
	}
	return out
}

// loginOptions are the flags of 'gateway login'.
type loginOptions struct {
	ClientID  string // overrides oidc_client_id for this login
	NoBrowser bool
}

func (a *app) envTrue(key string) bool {
	v := a.getenv(key)
	return v == "1" || strings.EqualFold(v, "true")
}

// oidcLogin runs the login flow for e and returns the tokens; it writes
// nothing.
func (a *app) oidcLogin(ctx context.Context, reg *registry, e gatewayEntry, o loginOptions, insecure bool) (oidcTokenBundle, error) {
	if e.OIDCIssuer == "" {
		return oidcTokenBundle{}, fmt.Errorf("gateway %q has OIDC auth but no oidc_issuer in its metadata", e.Name)
	}
	clientID := o.ClientID
	if clientID == "" {
		clientID = e.OIDCClientID
	}
	if clientID == "" {
		clientID = oidcDefaultClientID
	}
	hc := oidcHTTPClient(insecure)
	ctx = context.WithValue(ctx, oauth2.HTTPClient, hc)
	ep, err := discoverOIDC(ctx, hc, e.OIDCIssuer)
	if err != nil {
		return oidcTokenBundle{}, err
	}
	var tok *oauth2.Token
	switch {
	case a.getenv(envOIDCClientSecret) != "":
		tok, err = clientCredentialsToken(ctx, ep, clientID, a.getenv(envOIDCClientSecret), e.OIDCAudience, e.OIDCScopes)
	case (o.NoBrowser || a.envTrue(envNoBrowser)) && ep.Device != "":
		tok, err = a.deviceLogin(ctx, ep, clientID, e)
	default:
		tok, err = a.browserLogin(ctx, ep, clientID, e, reg.oidcPromptRequired(e.Name), !o.NoBrowser && !a.envTrue(envNoBrowser))
	}
	if err != nil {
		return oidcTokenBundle{}, err
	}
	if tok.AccessToken == "" {
		return oidcTokenBundle{}, fmt.Errorf("the OIDC issuer %s returned no access_token", e.OIDCIssuer)
	}
	return bundleFromToken(tok, e.OIDCIssuer, clientID), nil
}

func bundleFromToken(tok *oauth2.Token, issuer, clientID string) oidcTokenBundle {
	b := oidcTokenBundle{AccessToken: tok.AccessToken, RefreshToken: tok.RefreshToken, Issuer: issuer, ClientID: clientID}
	if !tok.Expiry.IsZero() {
		exp := tok.Expiry.Unix()
		b.ExpiresAt = &exp
	}
	return b
}

// clientCredentialsToken runs the client credentials grant with the
// client id and secret in the request body, as OpenShell's CLI sends them.
func clientCredentialsToken(ctx context.Context, ep oidcEndpoints, clientID, secret, audience, scopes string) (*oauth2.Token, error) {
	cc := clientcredentials.Config{ClientID: clientID, ClientSecret: secret, TokenURL: ep.Token,
		Scopes: strings.Fields(scopes), AuthStyle: oauth2.AuthStyleInParams}
	if audience != "" {
		cc.EndpointParams = url.Values{"audience": {audience}}
	}
	tok, err := cc.Token(ctx)
	if err != nil {
		return nil, fmt.Errorf("client credentials token request failed: %s", oauthErrorText(err))
	}
	return tok, nil
}

// oauthErrorText is an OAuth error without the response body, which may
// echo request values: the error code and description only.
func oauthErrorText(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		s := re.ErrorCode
		if s == "" && re.Response != nil {
			s = re.Response.Status
		}
		if re.ErrorDescription != "" {
			s += ": " + re.ErrorDescription
		}
		return s
	}
	return err.Error()
}

// deviceLogin runs the device authorization grant: it prints where to
// approve the login and polls the token endpoint.
func (a *app) deviceLogin(ctx context.Context, ep oidcEndpoints, clientID string, e gatewayEntry) (*oauth2.Token, error) {
	cfg := oauth2.Config{ClientID: clientID, Scopes: interactiveScopes(e.OIDCScopes),
		Endpoint: oauth2.Endpoint{DeviceAuthURL: ep.Device, TokenURL: ep.Token, AuthStyle: oauth2.AuthStyleInParams}}
	var opts []oauth2.AuthCodeOption
	if e.OIDCAudience != "" {
		opts = append(opts, oauth2.SetAuthURLParam("audience", e.OIDCAudience))
	}
	da, err := cfg.DeviceAuth(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("device authorization request failed: %s", oauthErrorText(err))
	}
	if da.VerificationURIComplete != "" {
		_, _ = fmt.Fprintf(a.stderr, "To log in to gateway %q, visit:\n  %s\n", e.Name, da.VerificationURIComplete)
	} else {
		_, _ = fmt.Fprintf(a.stderr, "To log in to gateway %q, visit:\n  %s\nand enter the code:\n  %s\n", e.Name, da.VerificationURI, da.UserCode)
	}
	_, _ = fmt.Fprintln(a.stderr, "Waiting for authorization...")
	tok, err := cfg.DeviceAccessToken(ctx, da)
	if err != nil {
		return nil, fmt.Errorf("device authorization failed: %s", oauthErrorText(err))
	}
	return tok, nil
}

// browserLogin runs authorization code + PKCE with a loopback redirect.
func (a *app) browserLogin(ctx context.Context, ep oidcEndpoints, clientID string, e gatewayEntry, freshPrompt, openBrowser bool) (*oauth2.Token, error) {
	if ep.Auth == "" {
		return nil, fmt.Errorf("the OIDC issuer %s advertises no authorization_endpoint", e.OIDCIssuer)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for the OIDC redirect: %w", err)
	}
	cfg := oauth2.Config{ClientID: clientID, Scopes: interactiveScopes(e.OIDCScopes),
		RedirectURL: fmt.Sprintf("http://%s/callback", ln.Addr()),
		Endpoint:    oauth2.Endpoint{AuthURL: ep.Auth, TokenURL: ep.Token, AuthStyle: oauth2.AuthStyleInParams}}
	state, verifier := oauth2.GenerateVerifier(), oauth2.GenerateVerifier()
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier)}
	if freshPrompt {
		// After 'gateway logout': ask the provider for a fresh login
		// instead of silently reusing the browser session.
		opts = append(opts, oauth2.SetAuthURLParam("prompt", "login"))
	}
	if e.OIDCAudience != "" {
		opts = append(opts, oauth2.SetAuthURLParam("audience", e.OIDCAudience))
	}
	authURL := cfg.AuthCodeURL(state, opts...)

	cb := &oidcCallback{state: state, done: make(chan struct{})}
	srv := &http.Server{Handler: cb, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer func() {
		_ = srv.Close()
		wg.Wait()
	}()

	_, _ = fmt.Fprintf(a.stderr, "To log in to gateway %q, open this URL in a browser on this machine:\n  %s\n", e.Name, authURL)
	if openBrowser {
		if err := a.openBrowser(authURL); err != nil {
			_, _ = fmt.Fprintf(a.stderr, "Could not open a browser (%v); open the URL above.\n", err)
		}
	}
	_, _ = fmt.Fprintln(a.stderr, "Waiting for the identity provider to redirect back...")
	timer := time.NewTimer(oidcLoginTimeout)
	defer timer.Stop()
	select {
	case <-cb.done:
	case <-timer.C:
		return nil, fmt.Errorf("OIDC login timed out after %s; try again with 'openshell gateway login %s'", oidcLoginTimeout, e.Name)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if cb.err != nil {
		return nil, cb.err
	}
	tok, err := cfg.Exchange(ctx, cb.code, oauth2.VerifierOption(verifier))
	if err != nil {
		return nil, fmt.Errorf("authorization code exchange failed: %s", oauthErrorText(err))
	}
	return tok, nil
}

// oidcCallback serves GET /callback?code=...&state=... once.
type oidcCallback struct {
	state string
	once  sync.Once
	done  chan struct{}
	code  string // set before done is closed
	err   error
}

func (c *oidcCallback) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != "/callback" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	var code string
	var err error
	switch {
	case q.Get("error") != "":
		err = fmt.Errorf("the identity provider refused the login: %s %s", q.Get("error"), q.Get("error_description"))
	case q.Get("state") != c.state:
		err = errors.New("the OIDC redirect carried a wrong state parameter; try again")
	case q.Get("code") == "":
		err = errors.New("the OIDC redirect carried no authorization code")
	default:
		code = q.Get("code")
	}
	first := false
	c.once.Do(func() {
		first = true
		c.code, c.err = code, err
		close(c.done)
	})
	msg := "Logged in. You can close this tab and return to the terminal."
	st := http.StatusOK
	switch {
	case !first:
		msg, st = "This login has already completed.", http.StatusConflict
	case err != nil:
		msg, st = "Login failed: "+err.Error(), http.StatusBadRequest
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(st)
	_, _ = fmt.Fprintf(w, "<!DOCTYPE html><html><body><h2>%s</h2></body></html>", html.EscapeString(msg))
}

// defaultOpenBrowser opens u with the platform's opener.
func defaultOpenBrowser(u string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", u)
	default:
		cmd = exec.Command("xdg-open", u)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }() // reap; the opener exits on its own
	return nil
}

// jwtPreferredUsername reads preferred_username from a JWT payload without
// verifying it, for the login message only (as OpenShell's CLI does).
func jwtPreferredUsername(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		PreferredUsername string `json:"preferred_username"`
	}
	_ = json.Unmarshal(b, &c)
	return c.PreferredUsername
}

// oidcAccessToken returns a usable access token of an auth_mode "oidc"
// gateway, refreshing one that expires within 30 s (and storing the new
// tokens). A missing token, or one that cannot be refreshed, is an error
// that says to log in.
func (a *app) oidcAccessToken(ctx context.Context, reg *registry, e gatewayEntry, insecure bool) (string, error) {
	path := reg.oidcTokenPath(e.Name)
	b, err := reg.loadOIDCToken(e.Name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("OIDC credentials for gateway %q are missing (%s): log in with 'openshell gateway login %s'", e.Name, path, e.Name)
	}
	if err != nil {
		return "", err
	}
	if b.ExpiresAt == nil || a.now().Add(oidcExpiryMargin).Unix() < *b.ExpiresAt {
		return b.AccessToken, nil
	}
	// One refresh at a time per gateway, across processes: an issuer that
	// rotates refresh tokens accepts each one once. Whoever waited reads
	// the tokens the other one stored.
	unlock, err := reg.lockOIDCToken(e.Name)
	if err != nil {
		return "", err
	}
	defer unlock()
	if b, err = reg.loadOIDCToken(e.Name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("OIDC credentials for gateway %q are missing (%s): log in with 'openshell gateway login %s'", e.Name, path, e.Name)
		}
		return "", err
	}
	if b.ExpiresAt == nil || a.now().Add(oidcExpiryMargin).Unix() < *b.ExpiresAt {
		return b.AccessToken, nil
	}
	expired := time.Unix(*b.ExpiresAt, 0).UTC().Format(time.RFC3339)
	secret := a.getenv(envOIDCClientSecret)
	if b.RefreshToken == "" && secret == "" {
		return "", fmt.Errorf("the OIDC access token for gateway %q expired at %s and there is no refresh token: log in again with 'openshell gateway login %s'", e.Name, expired, e.Name)
	}
	nb, err := a.refreshOIDC(ctx, b, e, secret, insecure)
	if err != nil {
		return "", fmt.Errorf("the OIDC access token for gateway %q expired at %s and could not be refreshed: %w; log in again with 'openshell gateway login %s'", e.Name, expired, err, e.Name)
	}
	if err := reg.storeOIDCToken(e.Name, nb); err != nil {
		return "", err
	}
	if a.logger != nil { // nil before setup
		a.logger.Debug("refreshed the OIDC access token", "gateway", e.Name)
	}
	return nb.AccessToken, nil
}

// refreshOIDC gets new tokens: the refresh_token grant resending the
// scopes of oidc_scopes (the refresh token is kept when the issuer returns
// none), or, without a refresh token, the client credentials grant again
// when OPENSHELL_OIDC_CLIENT_SECRET is set.
func (a *app) refreshOIDC(ctx context.Context, b oidcTokenBundle, e gatewayEntry, secret string, insecure bool) (oidcTokenBundle, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hc := oidcHTTPClient(insecure)
	ctx = context.WithValue(ctx, oauth2.HTTPClient, hc)
	ep, err := discoverOIDC(ctx, hc, b.Issuer)
	if err != nil {
		return oidcTokenBundle{}, err
	}
	if b.RefreshToken == "" {
		tok, err := clientCredentialsToken(ctx, ep, b.ClientID, secret, e.OIDCAudience, e.OIDCScopes)
		if err != nil {
			return oidcTokenBundle{}, err
		}
		return bundleFromToken(tok, b.Issuer, b.ClientID), nil
	}
	// x/oauth2's refresh does not resend scopes, so the grant is posted
	// here (RFC 6749 section 6).
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {b.RefreshToken}, "client_id": {b.ClientID}}
	if s := strings.Join(strings.Fields(e.OIDCScopes), " "); s != "" {
		form.Set("scope", s)
	}
	if secret != "" {
		form.Set("client_secret", secret)
	}
	tok, err := postTokenRequest(ctx, hc, ep.Token, form)
	if err != nil {
		return oidcTokenBundle{}, err
	}
	nb := bundleFromToken(tok, b.Issuer, b.ClientID)
	if nb.RefreshToken == "" {
		nb.RefreshToken = b.RefreshToken
	}
	return nb, nil
}

// postTokenRequest posts form to a token endpoint and decodes the answer.
// Errors carry the OAuth error code and description, never the body.
func postTokenRequest(ctx context.Context, hc *http.Client, tokenURL string, form url.Values) (*oauth2.Token, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	var tj struct {
		AccessToken      string `json:"access_token"`
		TokenType        string `json:"token_type"`
		RefreshToken     string `json:"refresh_token"`
		ExpiresIn        int64  `json:"expires_in"`
		Error            string `json:"error"`
		ErrorDescription string `json:"error_description"`
	}
	_ = json.Unmarshal(body, &tj)
	if resp.StatusCode != http.StatusOK || tj.Error != "" {
		msg := tj.Error
		if msg == "" {
			msg = resp.Status
		}
		if tj.ErrorDescription != "" {
			msg += ": " + tj.ErrorDescription
		}
		return nil, fmt.Errorf("the token endpoint refused the request: %s", msg)
	}
	if tj.AccessToken == "" {
		return nil, errors.New("the token endpoint returned no access_token")
	}
	tok := &oauth2.Token{AccessToken: tj.AccessToken, TokenType: tj.TokenType, RefreshToken: tj.RefreshToken, ExpiresIn: tj.ExpiresIn}
	if tj.ExpiresIn > 0 {
		tok.Expiry = time.Now().Add(time.Duration(tj.ExpiresIn) * time.Second)
	}
	return tok, nil
}

// revokeOIDC revokes the stored tokens at the issuer's revocation endpoint
// (RFC 7009): the refresh token first, then the access token. It reports
// whether the issuer has such an endpoint.
func revokeOIDC(ctx context.Context, b oidcTokenBundle, secret string, insecure bool) (bool, error) {
	hc := oidcHTTPClient(insecure)
	ep, err := discoverOIDC(ctx, hc, b.Issuer)
	if err != nil {
		return false, err
	}
	if ep.Revocation == "" {
		return false, nil
	}
	for _, t := range []struct{ tok, hint string }{{b.RefreshToken, "refresh_token"}, {b.AccessToken, "access_token"}} {
		if t.tok == "" {
			continue
		}
		form := url.Values{"token": {t.tok}, "token_type_hint": {t.hint}, "client_id": {b.ClientID}}
		if secret != "" {
			form.Set("client_secret", secret)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.Revocation, strings.NewReader(form.Encode()))
		if err != nil {
			return true, err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := hc.Do(req)
		if err != nil {
			return true, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return true, fmt.Errorf("revocation of the %s: %s", strings.ReplaceAll(t.hint, "_", " "), resp.Status)
		}
	}
	return true, nil
}
