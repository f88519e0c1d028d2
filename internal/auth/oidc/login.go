package oidc

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Login is the browser login of sandbox service hosts: an OAuth 2.0
// authorization-code flow with PKCE (S256) and an OIDC nonce against the
// issuer of an Authenticator, whose verifier checks the ID token exactly
// like a bearer token (signature, issuer, audience, expiry).
//
// Login keeps no server-side state: the login state (state, nonce, PKCE
// verifier, return path) and the session (the principal and an expiry)
// are sealed with AES-256-GCM under LoginOptions.Key, bound to their
// purpose and to the origin they were made for ("http(s)://host[:port]",
// authenticated data of the seal). Every Login with the same key accepts
// them (gateway replicas, a restarted gateway). Safe for concurrent use.
type Login struct {
	a       *Authenticator
	o       LoginOptions
	aead    cipher.AEAD
	now     func() time.Time
	hc      *http.Client
	session time.Duration
}

// LoginOptions configures a Login.
type LoginOptions struct {
	// ClientID is the OAuth client of the browser login.
	ClientID string
	// ClientSecret is its secret; empty for a public client (PKCE only).
	ClientSecret string
	// SessionTTL bounds a session; 0 = DefaultSessionTTL.
	SessionTTL time.Duration
	// Key seals login states and sessions (32 bytes); nil = a random
	// key, so that nothing sealed outlives this Login.
	Key []byte
	// Now is the clock; nil = time.Now.
	Now func() time.Time
}

// DefaultSessionTTL is how long a browser session lasts.
const DefaultSessionTTL = time.Hour

// loginStateTTL is how long a started login may take to come back.
const loginStateTTL = 10 * time.Minute

// maxSealed keeps a sealed session below what browsers store per cookie.
const maxSealed = 3800

// Seal purposes: a value sealed for one is never accepted as the other.
const (
	purposeState   = "openshell-login-state"
	purposeSession = "openshell-session"
)

// NewLogin returns the browser login against a's issuer.
func NewLogin(a *Authenticator, o LoginOptions) (*Login, error) {
	if a == nil {
		return nil, errors.New("oidc login: an OIDC authenticator is required")
	}
	if o.ClientID == "" {
		return nil, errors.New("oidc login: client id is required")
	}
	key := o.Key
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	}
	if len(key) != 32 {
		return nil, errors.New("oidc login: the sealing key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	l := &Login{a: a, o: o, aead: aead, now: o.Now, hc: a.opts.HTTPClient, session: o.SessionTTL}
	if l.now == nil {
		l.now = time.Now
	}
	if l.hc == nil {
		l.hc = http.DefaultClient
	}
	if l.session <= 0 {
		l.session = DefaultSessionTTL
	}
	return l, nil
}

// loginState is what the login-state cookie carries.
type loginState struct {
	State    string `json:"st"`
	Nonce    string `json:"n"`
	Verifier string `json:"v"`
	Redirect string `json:"r"`
	ReturnTo string `json:"p"`
	Expires  int64  `json:"e"`
}

// session is what the session cookie carries.
type session struct {
	Subject     string   `json:"s"`
	DisplayName string   `json:"d,omitempty"`
	Roles       []string `json:"r,omitempty"`
	Scopes      []string `json:"sc,omitempty"`
	Expires     int64    `json:"e"`
}

func (l *Login) config(ctx context.Context, redirectURI string) (*oauth2.Config, error) {
	if _, err := l.a.getVerifier(ctx); err != nil {
		return nil, errdefs.Unavailable("oidc issuer discovery failed")
	}
	l.a.mu.Lock()
	ep := l.a.provider.Endpoint()
	l.a.mu.Unlock()
	if ep.AuthURL == "" || ep.TokenURL == "" {
		return nil, errdefs.Unavailable("oidc issuer has no authorization or token endpoint")
	}
	ep.AuthStyle = oauth2.AuthStyleInHeader
	if l.o.ClientSecret == "" {
		ep.AuthStyle = oauth2.AuthStyleInParams
	}
	return &oauth2.Config{ClientID: l.o.ClientID, ClientSecret: l.o.ClientSecret, Endpoint: ep,
		RedirectURL: redirectURI, Scopes: []string{"openid", "profile", "email"}}, nil
}

// Start begins a login for origin: it returns the issuer's authorization
// URL to send the browser to and the sealed login state the browser keeps
// (in a cookie) until the callback. returnTo is the path to go back to; a
// value that is not a local path becomes "/".
func (l *Login) Start(ctx context.Context, origin, redirectURI, returnTo string) (authURL, state string, err error) {
	c, err := l.config(ctx, redirectURI)
	if err != nil {
		return "", "", err
	}
	st := loginState{State: rand.Text(), Nonce: rand.Text(), Verifier: oauth2.GenerateVerifier(),
		Redirect: redirectURI, ReturnTo: LocalPath(returnTo), Expires: l.now().Add(loginStateTTL).Unix()}
	sealed, err := l.seal(purposeState, origin, st)
	if err != nil {
		return "", "", err
	}
	u := c.AuthCodeURL(st.State, oauth2.S256ChallengeOption(st.Verifier), oauth2.SetAuthURLParam("nonce", st.Nonce))
	return u, sealed, nil
}

// Finish completes a login from the callback's query and the sealed login
// state: it checks the state, exchanges the code (with the PKCE verifier)
// at the token endpoint, verifies the ID token and its nonce, and returns
// a sealed session for origin, its expiry and the path to return to.
// Errors: InvalidArgument for a missing, expired or mismatched login state
// or a malformed callback; Unauthenticated when the issuer refuses or the
// ID token is not valid; Unavailable when the issuer cannot be reached.
func (l *Login) Finish(ctx context.Context, origin, state string, q url.Values) (sealed string, expires time.Time, returnTo string, err error) {
	var st loginState
	if state == "" || l.open(purposeState, origin, state, &st) != nil {
		return "", time.Time{}, "", errdefs.InvalidArgument("login state missing or not valid for this host")
	}
	if l.now().Unix() > st.Expires {
		return "", time.Time{}, "", errdefs.InvalidArgument("login state expired")
	}
	if got := q.Get("state"); got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(st.State)) != 1 {
		return "", time.Time{}, "", errdefs.InvalidArgument("login state mismatch")
	}
	if e := q.Get("error"); e != "" {
		return "", time.Time{}, "", errdefs.Unauthenticated("the issuer refused the login: " + errorCode(e))
	}
	code := q.Get("code")
	if code == "" {
		return "", time.Time{}, "", errdefs.InvalidArgument("callback without a code")
	}
	c, err := l.config(ctx, st.Redirect)
	if err != nil {
		return "", time.Time{}, "", err
	}
	tok, err := c.Exchange(context.WithValue(ctx, oauth2.HTTPClient, l.hc), code, oauth2.VerifierOption(st.Verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return "", time.Time{}, "", errdefs.Unauthenticated("the issuer refused the code: " + errorCode(re.ErrorCode))
		}
		return "", time.Time{}, "", errdefs.Unavailable("oidc token endpoint unreachable")
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", time.Time{}, "", errdefs.Unauthenticated("the issuer returned no id token")
	}
	p, idt, err := l.a.verify(ctx, raw)
	if err != nil {
		return "", time.Time{}, "", err
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(st.Nonce)) != 1 {
		return "", time.Time{}, "", errdefs.Unauthenticated("invalid token: nonce mismatch")
	}
	expires = l.now().Add(l.session).Truncate(time.Second)
	sealed, err = l.seal(purposeSession, origin, session{Subject: p.Subject, DisplayName: p.DisplayName,
		Roles: p.Roles, Scopes: p.Scopes, Expires: expires.Unix()})
	if err != nil {
		return "", time.Time{}, "", err
	}
	if len(sealed) > maxSealed {
		return "", time.Time{}, "", errdefs.FailedPrecondition("session too large for a cookie (too many roles or scopes)")
	}
	return sealed, expires, st.ReturnTo, nil
}

// Session opens a session cookie value for origin. It returns (nil, nil)
// for a session that has expired, and Unauthenticated for a value that is
// not a session sealed for origin by this gateway.
func (l *Login) Session(origin, value string) (*auth.Principal, error) {
	var s session
	if err := l.open(purposeSession, origin, value, &s); err != nil {
		return nil, errdefs.Unauthenticated("invalid session cookie")
	}
	if l.now().Unix() >= s.Expires {
		return nil, nil
	}
	return &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Subject: s.Subject,
		DisplayName: s.DisplayName, Roles: s.Roles, Scopes: s.Scopes}, nil
}

func aad(purpose, origin string) []byte {
	return []byte(purpose + "\x00" + strings.ToLower(origin))
}

func (l *Login) seal(purpose, origin string, v any) (string, error) {
	pt, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, l.aead.NonceSize(), l.aead.NonceSize()+len(pt)+l.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(l.aead.Seal(nonce, nonce, pt, aad(purpose, origin))), nil
}

func (l *Login) open(purpose, origin, value string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(b) < l.aead.NonceSize() {
		return errors.New("malformed")
	}
	pt, err := l.aead.Open(nil, b[:l.aead.NonceSize()], b[l.aead.NonceSize():], aad(purpose, origin))
	if err != nil {
		return err
	}
	return json.Unmarshal(pt, v)
}

// LocalPath returns p when it is a path on the same host ("/x?y"), else
// "/": never a scheme, another host ("//h", "/\h") or a relative path.
func LocalPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") || strings.ContainsAny(p, "\r\n") {
		return "/"
	}
	return p
}

// errorCode keeps an OAuth error code printable and short: it comes from
// the issuer or the browser and ends up in an answer and a log.
func errorCode(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	ok := func(r rune) bool {
		return r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
	}
	if strings.IndexFunc(s, func(r rune) bool { return !ok(r) }) >= 0 || s == "" {
		return "unknown_error"
	}
	return s
}

// String describes the login without secrets.
func (l *Login) String() string {
	return fmt.Sprintf("oidc-login(%s, client %s)", l.a.opts.Issuer, l.o.ClientID)
}
