package sandboxjwt

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/metadata"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

type keyPair struct {
	priv ed25519.PrivateKey
	kid  string
}

func newKey(t *testing.T) keyPair {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{priv, kid}
}

func (k keyPair) key() Key { return Key{KID: k.kid, Public: k.priv.Public().(ed25519.PublicKey)} }

func req(tok string) *auth.Request {
	return &auth.Request{FullMethod: "/openshell.v1.OpenShell/ConnectSupervisor", Metadata: metadata.Pairs("authorization", "Bearer "+tok)}
}

func TestKeyID(t *testing.T) {
	k := newKey(t)
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	if want := hex.EncodeToString(sum[:16]); k.kid != want || len(k.kid) != 32 {
		t.Errorf("KeyID() = %q, want %q", k.kid, want)
	}
}

func TestMintVerify(t *testing.T) {
	k := newKey(t)
	for _, ttl := range []time.Duration{0, time.Hour} {
		iss, err := NewIssuer(k.priv, k.kid, "gw", ttl)
		if err != nil {
			t.Fatal(err)
		}
		tok, exp, err := iss.Mint("sb-1")
		if err != nil {
			t.Fatal(err)
		}
		if (ttl == 0) != exp.IsZero() {
			t.Errorf("Mint() expiry = %v with ttl %v", exp, ttl)
		}
		v, err := NewVerifier("gw", k.key())
		if err != nil {
			t.Fatal(err)
		}
		p, err := v.Authenticate(t.Context(), req(tok))
		if err != nil {
			t.Fatalf("Authenticate() = %v", err)
		}
		if p.Kind != auth.KindSandbox || p.SandboxID != "sb-1" || p.Subject != "spiffe://openshell/sandbox/sb-1" || p.Source != auth.SourceSandboxJWT {
			t.Errorf("Authenticate() = %+v", p)
		}
		c, err := v.Verify(tok)
		if err != nil {
			t.Fatal(err)
		}
		if c.Issuer != "openshell-gateway:gw" || c.Audience != "openshell-gateway:gw" || (ttl == 0 && c.Expiry != 0) {
			t.Errorf("claims = %+v", c)
		}
		// A verifier of another gateway refuses it.
		other, _ := NewVerifier("other", k.key())
		if _, err := other.Authenticate(t.Context(), req(tok)); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("other gateway Authenticate() = %v, want Unauthenticated", err)
		}
	}
}

func TestRotation(t *testing.T) {
	old, cur := newKey(t), newKey(t)
	v, err := NewVerifier("gw", cur.key(), old.key())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []keyPair{old, cur} {
		iss, _ := NewIssuer(k.priv, k.kid, "gw", 0)
		tok, _, _ := iss.Mint("sb")
		if p, err := v.Authenticate(t.Context(), req(tok)); err != nil || p == nil {
			t.Errorf("token of key %s: Authenticate() = %v, %v", k.kid, p, err)
		}
	}
	b, err := v.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 2 || set.Keys[0].KeyID != cur.kid || set.Keys[1].KeyID != old.kid {
		t.Errorf("JWKS() = %s", b)
	}
	if _, err := NewVerifier("gw", cur.key(), cur.key()); err == nil {
		t.Error("NewVerifier with a duplicate kid succeeded")
	}
}

func TestVerifyRejections(t *testing.T) {
	k := newKey(t)
	v, _ := NewVerifier("gw", k.key())
	aud := Audience("gw")
	sign := func(alg jose.SignatureAlgorithm, key any, kid, typ string, claims map[string]any) string {
		opts := (&jose.SignerOptions{}).WithHeader("kid", kid)
		if typ != "" {
			opts = opts.WithType(jose.ContentType(typ))
		}
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(claims).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := func() map[string]any {
		return map[string]any{"sub": SubjectPrefix + "s", "iss": aud, "aud": aud, "iat": time.Now().Unix(), "exp": 0, "sandbox_id": "s"}
	}
	with := func(k string, v any) map[string]any { c := good(); c[k] = v; return c }
	without := func(k string) map[string]any { c := good(); delete(c, k); return c }
	tests := []struct {
		name    string
		tok     string
		notMine bool
		msg     string
	}{
		{"hs256 falls through", sign(jose.HS256, []byte("0123456789abcdef0123456789abcdef"), k.kid, "", good()), true, ""},
		{"unknown kid falls through", sign(jose.EdDSA, k.priv, "nope", "", good()), true, ""},
		{"not a jwt falls through", "abc", true, ""},
		{"extension typ", sign(jose.EdDSA, k.priv, k.kid, ExtensionTokenType, good()), false, "extension tokens cannot authenticate to the gateway"},
		{"expired", sign(jose.EdDSA, k.priv, k.kid, "", with("exp", time.Now().Add(-2*time.Minute).Unix())), false, "invalid token: token expired"},
		{"future iat", sign(jose.EdDSA, k.priv, k.kid, "", with("iat", time.Now().Add(10*time.Minute).Unix())), false, "invalid token: token used before issued"},
		{"wrong issuer", sign(jose.EdDSA, k.priv, k.kid, "", with("iss", "x")), false, "invalid token: wrong issuer"},
		{"subject mismatch", sign(jose.EdDSA, k.priv, k.kid, "", with("sub", SubjectPrefix+"other")), false, "invalid token: subject does not name the sandbox"},
		{"missing exp", sign(jose.EdDSA, k.priv, k.kid, "", without("exp")), false, "invalid token: missing claim exp"},
		{"missing sandbox_id", sign(jose.EdDSA, k.priv, k.kid, "", without("sandbox_id")), false, "invalid token: missing claim sandbox_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Authenticate(t.Context(), req(tc.tok))
			if tc.notMine {
				if p != nil || err != nil {
					t.Errorf("Authenticate() = %v, %v, want (nil, nil)", p, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnauthenticated) || err.Error() != tc.msg {
				t.Errorf("Authenticate() = %v, %v, want Unauthenticated %q", p, err, tc.msg)
			}
		})
	}
}

// TestMintExtension: a minted extension token is typed openshell-ext+jwt
// and refused by the gateway's own verifier with OpenShell's text, while a
// sandbox token of the same key has neither that typ nor another audience;
// the audience and lifetime are bounded as in OpenShell.
func TestMintExtension(t *testing.T) {
	k := newKey(t)
	iss, err := NewIssuer(k.priv, k.kid, "gw", 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier("gw", k.key())
	if err != nil {
		t.Fatal(err)
	}
	tok, exp, err := iss.MintExtension("urn:openshell:extension:interceptor:x", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(exp); d < 4*time.Minute || d > 5*time.Minute {
		t.Errorf("expires in %v, want 5m", d)
	}
	if h, _ := parseHeader(tok); h.Typ != ExtensionTokenType || h.Kid != k.kid || h.Alg != "EdDSA" {
		t.Errorf("header = %+v", h)
	}
	p, err := v.Authenticate(t.Context(), req(tok))
	if p != nil || !errors.Is(err, errdefs.ErrUnauthenticated) || err.Error() != "extension tokens cannot authenticate to the gateway" {
		t.Errorf("Authenticate(extension token) = %v, %v", p, err)
	}
	// Either discriminator alone separates the two kinds signed by the same
	// key: a sandbox token has neither the typ nor an extension audience.
	sb, _, err := iss.Mint("sb")
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := parseHeader(sb); h.Typ == ExtensionTokenType || h.Kid != k.kid {
		t.Errorf("sandbox token header = %+v, want the same kid and no %s typ", h, ExtensionTokenType)
	}
	if c, err := v.Verify(sb); err != nil || c.Audience != Audience("gw") {
		t.Errorf("sandbox token = %+v, %v, want audience %s", c, err, Audience("gw"))
	}
	for _, tc := range []struct {
		aud string
		ttl time.Duration
	}{{"", time.Minute}, {Audience("gw"), time.Minute}, {"urn:x", 0}, {"urn:x", MaxExtensionTTL + time.Second}} {
		if _, _, err := iss.MintExtension(tc.aud, tc.ttl); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("MintExtension(%q, %v) = %v, want InvalidArgument", tc.aud, tc.ttl, err)
		}
	}
}

// TestMintSupervisorExtension: a supervisor's extension token has
// OpenShell's claims (caller_kind supervisor, sub the sandbox's SPIFFE id,
// sandbox_id), verifies with the JWKS key, is refused by the gateway, and
// needs a sandbox id; a gateway token has caller_kind gateway and no
// sandbox_id.
func TestMintSupervisorExtension(t *testing.T) {
	k := newKey(t)
	iss, _ := NewIssuer(k.priv, k.kid, "gw", 0)
	v, _ := NewVerifier("gw", k.key())
	claimsOf := func(tok string) map[string]any {
		t.Helper()
		parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
		if err != nil {
			t.Fatal(err)
		}
		var c map[string]any
		if err := parsed.Claims(k.priv.Public(), &c); err != nil {
			t.Fatalf("token does not verify with the gateway key: %v", err)
		}
		for _, drop := range []string{"iat", "exp", "jti"} {
			if _, ok := c[drop]; !ok {
				t.Errorf("claim %s missing", drop)
			}
			delete(c, drop)
		}
		return c
	}
	tok, _, err := iss.MintSupervisorExtension("urn:openshell:extension:middleware:scan", "sb-1", 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"iss": "openshell-gateway:gw", "aud": "urn:openshell:extension:middleware:scan", "sub": "spiffe://openshell/sandbox/sb-1", "caller_kind": "supervisor", "sandbox_id": "sb-1"}
	if diff := cmp.Diff(want, claimsOf(tok)); diff != "" {
		t.Errorf("supervisor extension claims (-want +got):\n%s", diff)
	}
	if h, _ := parseHeader(tok); h.Typ != ExtensionTokenType {
		t.Errorf("typ = %q, want %s", h.Typ, ExtensionTokenType)
	}
	if p, err := v.Authenticate(t.Context(), req(tok)); p != nil || !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Authenticate(supervisor extension token) = %v, %v, want Unauthenticated", p, err)
	}
	gw, _, err := iss.MintExtension("urn:openshell:extension:interceptor:x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]any{"iss": "openshell-gateway:gw", "aud": "urn:openshell:extension:interceptor:x", "sub": "openshell-gateway:gw", "caller_kind": "gateway"}
	if diff := cmp.Diff(want, claimsOf(gw)); diff != "" {
		t.Errorf("gateway extension claims (-want +got):\n%s", diff)
	}
	for _, id := range []string{"", "  "} {
		if _, _, err := iss.MintSupervisorExtension("urn:x", id, time.Minute); !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != "supervisor extension tokens require a sandbox ID" {
			t.Errorf("MintSupervisorExtension(sandbox %q) = %v, want InvalidArgument", id, err)
		}
	}
	if _, _, err := iss.MintSupervisorExtension(Audience("gw"), "sb-1", time.Minute); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("MintSupervisorExtension(gateway audience) = %v, want InvalidArgument", err)
	}
}

// TestDiscovery: OpenShell's discovery fields, issuer equal to the iss of
// the tokens, and no document without a base URL to make jwks_uri absolute.
func TestDiscovery(t *testing.T) {
	k := newKey(t)
	v, _ := NewVerifier("gw", k.key())
	b, err := v.Discovery("https://gw.example:17670")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"issuer":                                "openshell-gateway:gw",
		"jwks_uri":                              "https://gw.example:17670/.well-known/jwks.json",
		"id_token_signing_alg_values_supported": []any{"EdDSA"},
		"response_types_supported":              []any{"id_token"},
		"subject_types_supported":               []any{"public"},
		"scopes_supported":                      []any{"openid"},
		"claims_supported":                      []any{"iss", "aud", "sub", "iat", "exp", "jti", "caller_kind", "sandbox_id"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Discovery() (-want +got):\n%s", diff)
	}
	if _, err := v.Discovery(""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Discovery(\"\") = %v, want InvalidArgument", err)
	}
}
