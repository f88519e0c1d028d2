package interceptor

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth/sandboxjwt"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// lockedBuffer is a log sink safe for the concurrent writes of the runtime.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newGatewayKeys(t *testing.T) (*sandboxjwt.Issuer, *sandboxjwt.Verifier, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := sandboxjwt.KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := sandboxjwt.NewIssuer(priv, kid, "gw-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ver, err := sandboxjwt.NewVerifier("gw-test", sandboxjwt.Key{KID: kid, Public: pub})
	if err != nil {
		t.Fatal(err)
	}
	return iss, ver, kid
}

// TestExtensionTokenOnTheWire checks the token a unix:// interceptor
// receives as an interceptor would: against the gateway's JWKS, with the
// typ, exact audience, issuer and expiry pinned; that it is reused across
// calls; that the gateway itself refuses it; and that it is never logged.
func TestExtensionTokenOnTheWire(t *testing.T) {
	iss, ver, kid := newGatewayKeys(t)
	sock := filepath.Join(t.TempDir(), "ic.sock")
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "allow", "", "-unix", sock)
	cfg := config("guard", f)
	cfg.AllowInsecureTransport = false
	cfg.Audience = "urn:example:guard-exact"
	logs := &lockedBuffer{}
	rt, err := Start(t.Context(), Options{Configs: []Config{cfg}, Tokens: iss,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	client, _, _ := serve(t, rt)
	for range 2 {
		if _, err := client.CreateProvider(t.Context(), &openshellv1.CreateProviderRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	auths := f.authorizations(t)
	if len(auths) != 2 || len(auths[0]) != 1 || len(auths[1]) != 1 {
		t.Fatalf("authorization metadata = %q, want one value on each of 2 calls", auths)
	}
	if auths[0][0] != auths[1][0] {
		t.Error("the token was not reused for the second call")
	}
	tok, ok := strings.CutPrefix(auths[0][0], "Bearer ")
	if !ok {
		t.Fatalf("authorization %q is not a Bearer token", auths[0][0])
	}

	// Verify as an interceptor would, from the published JWKS.
	js, err := ver.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(js, &set); err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	h := parsed.Headers[0]
	if h.ExtraHeaders[jose.HeaderType] != "openshell-ext+jwt" || h.KeyID != kid || h.Algorithm != string(jose.EdDSA) {
		t.Fatalf("header typ=%v kid=%q alg=%q", h.ExtraHeaders[jose.HeaderType], h.KeyID, h.Algorithm)
	}
	keys := set.Key(h.KeyID)
	if len(keys) != 1 {
		t.Fatalf("JWKS has %d keys for kid %q", len(keys), h.KeyID)
	}
	var c map[string]any
	if err := parsed.Claims(keys[0].Key, &c); err != nil {
		t.Fatalf("signature does not verify against the JWKS: %v", err)
	}
	if c["aud"] != "urn:example:guard-exact" {
		t.Errorf("aud = %#v, want exactly the configured audience", c["aud"])
	}
	if c["iss"] != "openshell-gateway:gw-test" || c["sub"] != "openshell-gateway:gw-test" || c["caller_kind"] != "gateway" {
		t.Errorf("iss=%v sub=%v caller_kind=%v", c["iss"], c["sub"], c["caller_kind"])
	}
	if jti, _ := c["jti"].(string); jti == "" {
		t.Error("jti missing")
	}
	exp, _ := c["exp"].(float64)
	iat, _ := c["iat"].(float64)
	if exp-iat != extensionTokenTTL.Seconds() || time.Unix(int64(exp), 0).Before(time.Now()) {
		t.Errorf("iat=%v exp=%v, want a live %v token", iat, exp, extensionTokenTTL)
	}

	// The gateway refuses it as a credential.
	_, err = ver.Verify(tok)
	if !errors.Is(err, errdefs.ErrUnauthenticated) || err.Error() != "extension tokens cannot authenticate to the gateway" {
		t.Errorf("gateway verifier: %v, want unauthenticated \"extension tokens cannot authenticate to the gateway\"", err)
	}

	if strings.Contains(logs.String(), tok) || strings.Contains(logs.String(), strings.Split(tok, ".")[2]) {
		t.Error("the extension token appears in the logs")
	}
}

// TestNoExtensionTokenOverPlaintext: an http:// interceptor
// (allow_insecure_transport) gets no credential, as in OpenShell.
func TestNoExtensionTokenOverPlaintext(t *testing.T) {
	iss, _, _ := newGatewayKeys(t)
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "allow", "")
	rt, err := Start(t.Context(), Options{Configs: []Config{config("plain", f)}, Tokens: iss, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	client, _, _ := serve(t, rt)
	if _, err := client.CreateProvider(t.Context(), &openshellv1.CreateProviderRequest{}); err != nil {
		t.Fatal(err)
	}
	auths := f.authorizations(t)
	if len(auths) != 1 || len(auths[0]) != 0 {
		t.Fatalf("authorization metadata = %q, want none on the one call", auths)
	}
}

type countingMinter struct{ n int }

func (m *countingMinter) MintExtension(aud string, ttl time.Duration) (string, time.Time, error) {
	m.n++
	return aud + "-" + string(rune('0'+m.n)), time.Unix(1000, 0).Add(ttl), nil
}

// TestExtensionCredentialCache: a token is reused until it is within
// extensionTokenRefresh of expiry, then replaced.
func TestExtensionCredentialCache(t *testing.T) {
	m := &countingMinter{}
	now := time.Unix(1000, 0)
	c := &extensionCredential{minter: m, audience: "aud", now: func() time.Time { return now }}
	get := func() string {
		md, err := c.GetRequestMetadata(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return md["authorization"]
	}
	if a, b := get(), get(); a != "Bearer aud-1" || b != a {
		t.Fatalf("first two calls: %q %q, want Bearer aud-1 twice", a, b)
	}
	now = now.Add(extensionTokenTTL - extensionTokenRefresh - time.Second)
	if got := get(); got != "Bearer aud-1" {
		t.Fatalf("before the refresh window: %q", got)
	}
	now = now.Add(2 * time.Second)
	if got := get(); got != "Bearer aud-2" {
		t.Fatalf("inside the refresh window: %q, want a new token", got)
	}
}

// TestExtensionAudienceOfTheGatewayRefused: an audience equal to the
// gateway's own sandbox audience cannot be minted, so Describe fails and
// the interceptor stops the start-up with its name.
func TestExtensionAudienceOfTheGatewayRefused(t *testing.T) {
	iss, _, _ := newGatewayKeys(t)
	sock := filepath.Join(t.TempDir(), "ic.sock")
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "allow", "", "-unix", sock)
	cfg := config("selfaud", f)
	cfg.Audience = sandboxjwt.Audience("gw-test")
	_, err := Start(t.Context(), Options{Configs: []Config{cfg}, Tokens: iss, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), `interceptor "selfaud"`) {
		t.Fatalf("Start = %v, want an error naming the interceptor", err)
	}
}

// TestStrictVerifierRefusesDescribe: an interceptor that checks the
// audience before answering Describe refuses a gateway configured with
// another audience, and start-up fails as an authentication failure; with
// the audience it expects, start-up succeeds.
func TestStrictVerifierRefusesDescribe(t *testing.T) {
	iss, _, _ := newGatewayKeys(t)
	sock := filepath.Join(t.TempDir(), "ic.sock")
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "allow", "", "-unix", sock, "-require-audience", "urn:example:strict")
	cfg := config("strict", f)
	cfg.AllowInsecureTransport = false
	cfg.Audience = "urn:example:other"
	_, err := Start(t.Context(), Options{Configs: []Config{cfg}, Tokens: iss, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), `interceptor "strict"`) || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Fatalf("Start with another audience = %v, want an authentication failure naming the interceptor", err)
	}
	cfg.Audience = "urn:example:strict"
	rt, err := Start(t.Context(), Options{Configs: []Config{cfg}, Tokens: iss, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Start with the expected audience: %v", err)
	}
	rt.Close()
}
