package cli

import (
	"crypto/rand"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/auth/oidc/oidctest"
)

// ciBotSecret is the secret of the confidential client "ci-bot".
var ciBotSecret = "ci-secret-" + rand.Text()

// newTestIssuer starts a provider for the CLI's public client
// "openshell-cli" with rotating refresh tokens, five-minute tokens, the
// client credentials client "ci-bot" and, when asked, device
// authorization (approved as dave) and revocation.
func newTestIssuer(t testing.TB, device, revocation bool) *oidctest.Issuer {
	t.Helper()
	opts := oidctest.Options{Refresh: true, ServiceClientID: "ci-bot", ServiceSecret: ciBotSecret,
		Revocation: revocation, TokenTTL: 5 * time.Minute}
	if device {
		opts.DeviceUser = oidctest.User{Subject: "dave", Roles: []string{"openshell-user"}}
	}
	return oidctest.NewWithOptions(t, "openshell-cli", "", opts)
}

// lastTokenRequest returns the form of the issuer's latest token request.
func lastTokenRequest(t testing.TB, is *oidctest.Issuer) url.Values {
	t.Helper()
	reqs := is.TokenRequests()
	if len(reqs) == 0 {
		t.Fatal("the issuer saw no token request")
	}
	return reqs[len(reqs)-1]
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
