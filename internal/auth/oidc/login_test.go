package oidc

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/auth/oidc/oidctest"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const (
	testHost     = "http://web--app.openshell.localhost:17670"
	testRedirect = testHost + "/.openshell/oidc/callback"
)

func newLogin(t *testing.T, is *oidctest.Issuer, secret string, now func() time.Time) *Login {
	t.Helper()
	a, err := New(Options{Issuer: is.URL, Audience: "openshell-cli", RolesClaim: "realm_access.roles"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLogin(a, LoginOptions{ClientID: "openshell-cli", ClientSecret: secret, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// authorize follows the authorization URL to the issuer and returns the
// query the browser would bring back to the callback.
func authorize(t *testing.T, authURL string) url.Values {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil || !strings.HasPrefix(loc.String(), testRedirect+"?") {
		t.Fatalf("authorize = %d %q, want a redirect to the callback", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query()
}

func TestLoginFlow(t *testing.T) {
	is := oidctest.New(t, "openshell-cli", "s3cret-"+t.Name())
	is.SetUser(oidctest.User{Subject: "carol", Roles: []string{"openshell-user", "dev"}})
	l := newLogin(t, is, "s3cret-"+t.Name(), nil)

	authURL, state, err := l.Start(t.Context(), testHost, testRedirect, "/page?x=1")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(authURL)
	for k, want := range map[string]string{"response_type": "code", "client_id": "openshell-cli", "redirect_uri": testRedirect, "code_challenge_method": "S256"} {
		if got := u.Query().Get(k); got != want {
			t.Errorf("authorization URL %s = %q, want %q", k, got, want)
		}
	}
	if u.Query().Get("nonce") == "" || u.Query().Get("state") == "" || !strings.Contains(u.Query().Get("scope"), "openid") {
		t.Errorf("authorization URL %s lacks nonce, state or openid scope", authURL)
	}
	if strings.Contains(state, u.Query().Get("state")) || strings.Contains(state, u.Query().Get("nonce")) {
		t.Errorf("login state cookie %q shows the state or nonce in clear", state)
	}
	q := authorize(t, authURL)
	sealed, exp, returnTo, err := l.Finish(t.Context(), testHost, state, q)
	if err != nil {
		t.Fatalf("Finish() = %v", err)
	}
	if returnTo != "/page?x=1" || time.Until(exp) < 59*time.Minute || time.Until(exp) > time.Hour {
		t.Errorf("Finish() returnTo %q expires %v, want /page?x=1 in an hour", returnTo, exp)
	}
	for _, s := range is.Secrets() {
		if strings.Contains(sealed, s) {
			t.Fatalf("session cookie contains an issuer secret or token in clear")
		}
	}
	p, err := l.Session(testHost, sealed)
	if err != nil || p == nil || p.Subject != "carol" || p.Source != auth.SourceOIDC || p.Kind != auth.KindUser ||
		!slices.Equal(p.Roles, []string{"openshell-user", "dev"}) {
		t.Fatalf("Session() = %+v, %v, want carol with her roles", p, err)
	}

	// A code is good once; the login state too (the server drops the
	// cookie, and the issuer refuses the code again).
	if _, _, _, err := l.Finish(t.Context(), testHost, state, q); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Finish() with a used code = %v, want Unauthenticated", err)
	}
}

func TestLoginRefusals(t *testing.T) {
	is := oidctest.New(t, "openshell-cli", "")
	l := newLogin(t, is, "", nil)
	start := func(t *testing.T) (string, url.Values) {
		t.Helper()
		authURL, state, err := l.Start(t.Context(), testHost, testRedirect, "/")
		if err != nil {
			t.Fatal(err)
		}
		return state, authorize(t, authURL)
	}
	t.Run("state mismatch", func(t *testing.T) {
		state, q := start(t)
		q.Set("state", "other")
		if _, _, _, err := l.Finish(t.Context(), testHost, state, q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Finish() = %v, want InvalidArgument", err)
		}
	})
	t.Run("no login state", func(t *testing.T) {
		_, q := start(t)
		if _, _, _, err := l.Finish(t.Context(), testHost, "", q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Finish() = %v, want InvalidArgument", err)
		}
	})
	t.Run("login state of another host", func(t *testing.T) {
		state, q := start(t)
		if _, _, _, err := l.Finish(t.Context(), "http://evil--app.openshell.localhost:17670", state, q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Finish() = %v, want InvalidArgument", err)
		}
	})
	t.Run("issuer error", func(t *testing.T) {
		state, q := start(t)
		q.Del("code")
		q.Set("error", "access_denied")
		if _, _, _, err := l.Finish(t.Context(), testHost, state, q); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "access_denied") {
			t.Fatalf("Finish() = %v, want Unauthenticated access_denied", err)
		}
	})
	t.Run("wrong audience", func(t *testing.T) {
		is.SetAudience("someone-else")
		defer is.SetAudience("openshell-cli")
		state, q := start(t)
		if _, _, _, err := l.Finish(t.Context(), testHost, state, q); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "audience") {
			t.Fatalf("Finish() = %v, want Unauthenticated wrong audience", err)
		}
	})
	t.Run("login state expired", func(t *testing.T) {
		later := newLogin(t, is, "", func() time.Time { return time.Now().Add(11 * time.Minute) })
		later.aead = l.aead
		state, q := start(t)
		if _, _, _, err := later.Finish(t.Context(), testHost, state, q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Finish() = %v, want InvalidArgument", err)
		}
	})
}

func TestSession(t *testing.T) {
	is := oidctest.New(t, "openshell-cli", "")
	l := newLogin(t, is, "", nil)
	authURL, state, err := l.Start(t.Context(), testHost, testRedirect, "/")
	if err != nil {
		t.Fatal(err)
	}
	sealed, _, _, err := l.Finish(t.Context(), testHost, state, authorize(t, authURL))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	flipped := base64.RawURLEncoding.EncodeToString(raw)
	other := newLogin(t, is, "", nil) // another gateway (another key)
	replica := newLogin(t, is, "", nil)
	replica.aead = l.aead // the same key: another replica, or after a restart
	if p, err := replica.Session(testHost, sealed); err != nil || p == nil {
		t.Errorf("Session() on a Login with the same key = %v, %v, want the principal", p, err)
	}
	for name, tc := range map[string]struct {
		l           *Login
		host, value string
	}{
		"modified":             {l, testHost, flipped},
		"garbage":              {l, testHost, "not-a-session"},
		"other host":           {l, "http://web--other.openshell.localhost:17670", sealed},
		"other scheme":         {l, "https://web--app.openshell.localhost:17670", sealed},
		"other gateway":        {other, testHost, sealed},
		"login state as value": {l, testHost, state},
	} {
		if p, err := tc.l.Session(tc.host, tc.value); p != nil || !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Session() = %v, %v, want Unauthenticated", name, p, err)
		}
	}
	expired := newLogin(t, is, "", func() time.Time { return time.Now().Add(DefaultSessionTTL + time.Second) })
	expired.aead = l.aead
	if p, err := expired.Session(testHost, sealed); p != nil || err != nil {
		t.Errorf("expired: Session() = %v, %v, want (nil, nil)", p, err)
	}
}

func TestLocalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/a/b?c=d": "/a/b?c=d", "/": "/", "": "/", "//evil.example/": "/", "/\\evil.example": "/",
		"https://evil.example/": "/", "a/b": "/", "/x\r\nSet-Cookie: y": "/",
	} {
		if got := LocalPath(in); got != want {
			t.Errorf("LocalPath(%q) = %q, want %q", in, got, want)
		}
	}
}
