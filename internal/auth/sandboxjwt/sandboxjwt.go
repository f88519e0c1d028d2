// Package sandboxjwt mints and verifies the gateway's sandbox identity
// tokens: Ed25519 (EdDSA) JWTs whose subject is
// spiffe://openshell/sandbox/<id> and whose issuer and audience are
// openshell-gateway:<gateway_id>. An exp of 0 means the token never
// expires. Several verification keys can be active at once (rotation),
// selected by the kid header. The same key signs the extension tokens the
// gateway sends to interceptors (MintExtension, caller_kind gateway) and
// mints for supervisors (MintSupervisorExtension, caller_kind supervisor),
// typ openshell-ext+jwt, which the Verifier refuses.
package sandboxjwt

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ExtensionTokenType is the typ header of extension credentials, which
// never authenticate to the gateway.
const ExtensionTokenType = "openshell-ext+jwt"

// SubjectPrefix prefixes the sandbox id in the sub claim.
const SubjectPrefix = "spiffe://openshell/sandbox/"

// Leeway is the clock skew tolerated on iat/exp.
const Leeway = 60 * time.Second

// Audience returns the iss/aud value for gatewayID.
func Audience(gatewayID string) string { return "openshell-gateway:" + gatewayID }

// KeyID returns the kid of pub: the hex of the first 16 bytes of the
// SHA-256 of its PKIX DER encoding.
func KeyID(pub ed25519.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("encode public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:16]), nil
}

// Claims are the claims of a sandbox token.
type Claims struct {
	Subject   string `json:"sub"`
	Issuer    string `json:"iss"`
	Audience  string `json:"aud"`
	IssuedAt  int64  `json:"iat"`
	Expiry    int64  `json:"exp"`
	SandboxID string `json:"sandbox_id"`
}

// Issuer mints sandbox tokens. It is safe for concurrent use.
type Issuer struct {
	signer    jose.Signer
	extSigner jose.Signer
	gatewayID string
	ttl       time.Duration
	now       func() time.Time
}

// NewIssuer returns an issuer signing with key under kid. ttl 0 mints
// tokens that never expire.
func NewIssuer(key ed25519.PrivateKey, kid, gatewayID string, ttl time.Duration) (*Issuer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("sandbox jwt: invalid ed25519 signing key")
	}
	if kid == "" || gatewayID == "" {
		return nil, errors.New("sandbox jwt: kid and gateway id are required")
	}
	if ttl < 0 {
		return nil, errors.New("sandbox jwt: negative ttl")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return nil, fmt.Errorf("sandbox jwt: signer: %w", err)
	}
	extSigner, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key},
		(&jose.SignerOptions{}).WithType(ExtensionTokenType).WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return nil, fmt.Errorf("sandbox jwt: extension signer: %w", err)
	}
	return &Issuer{signer: signer, extSigner: extSigner, gatewayID: gatewayID, ttl: ttl, now: time.Now}, nil
}

// TTL returns the lifetime of minted tokens (0 = never expire).
func (i *Issuer) TTL() time.Duration { return i.ttl }

// Mint returns a token for sandboxID and its expiry (zero time when the
// token never expires).
func (i *Issuer) Mint(sandboxID string) (token string, expiresAt time.Time, err error) {
	if sandboxID == "" {
		return "", time.Time{}, errdefs.InvalidArgument("sandbox id is required")
	}
	now := i.now()
	c := Claims{
		Subject:   SubjectPrefix + sandboxID,
		Issuer:    Audience(i.gatewayID),
		Audience:  Audience(i.gatewayID),
		IssuedAt:  now.Unix(),
		SandboxID: sandboxID,
	}
	if i.ttl > 0 {
		expiresAt = now.Add(i.ttl)
		c.Expiry = expiresAt.Unix()
	}
	token, err = jwt.Signed(i.signer).Claims(c).Serialize()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sandbox jwt: sign: %w", err)
	}
	return token, expiresAt, nil
}

// MaxExtensionTTL is the longest lifetime of an extension token
// (OpenShell's MAX_EXTENSION_TOKEN_TTL).
const MaxExtensionTTL = time.Hour

// Caller kinds of extension tokens (OpenShell's ExtensionCallerKind).
const (
	// CallerGateway: the gateway calls the extension (interceptors).
	CallerGateway = "gateway"
	// CallerSupervisor: a sandbox's supervisor calls the extension, with a
	// credential the gateway minted for it in RefreshSandboxToken.
	CallerSupervisor = "supervisor"
)

// ExtensionClaims are the claims of an extension token.
type ExtensionClaims struct {
	Issuer     string `json:"iss"`
	Audience   string `json:"aud"`
	Subject    string `json:"sub"`
	IssuedAt   int64  `json:"iat"`
	Expiry     int64  `json:"exp"`
	ID         string `json:"jti"`
	CallerKind string `json:"caller_kind"`
	// SandboxID is set for caller_kind supervisor only.
	SandboxID string `json:"sandbox_id,omitempty"`
}

// MintExtension returns an extension token for the gateway's own calls to
// the exact audience, valid for ttl (1s to MaxExtensionTTL), and its
// expiry. The header carries typ openshell-ext+jwt, so the gateway's own
// Verifier refuses it; iss and sub are openshell-gateway:<gateway_id>,
// caller_kind is "gateway" and there is no sandbox_id.
func (i *Issuer) MintExtension(audience string, ttl time.Duration) (token string, expiresAt time.Time, err error) {
	return i.mintExtension(audience, CallerGateway, "", ttl)
}

// MintSupervisorExtension returns an extension token the supervisor of
// sandboxID presents to the extension of the exact audience: as
// MintExtension, but caller_kind "supervisor", sub
// spiffe://openshell/sandbox/<id> and a sandbox_id claim.
func (i *Issuer) MintSupervisorExtension(audience, sandboxID string, ttl time.Duration) (token string, expiresAt time.Time, err error) {
	if strings.TrimSpace(sandboxID) == "" {
		return "", time.Time{}, errdefs.InvalidArgument("supervisor extension tokens require a sandbox ID")
	}
	return i.mintExtension(audience, CallerSupervisor, sandboxID, ttl)
}

func (i *Issuer) mintExtension(audience, kind, sandboxID string, ttl time.Duration) (token string, expiresAt time.Time, err error) {
	if audience == "" || audience == Audience(i.gatewayID) {
		return "", time.Time{}, errdefs.InvalidArgument("extension audience must be set and differ from the gateway sandbox audience")
	}
	if ttl < time.Second || ttl > MaxExtensionTTL {
		return "", time.Time{}, errdefs.InvalidArgument(fmt.Sprintf("extension token ttl must be between 1 and %d seconds", int(MaxExtensionTTL.Seconds())))
	}
	var jti [16]byte
	if _, err := rand.Read(jti[:]); err != nil {
		return "", time.Time{}, fmt.Errorf("sandbox jwt: jti: %w", err)
	}
	now := i.now()
	expiresAt = now.Add(ttl)
	c := ExtensionClaims{
		Issuer: Audience(i.gatewayID), Audience: audience, Subject: Audience(i.gatewayID),
		IssuedAt: now.Unix(), Expiry: expiresAt.Unix(), ID: hex.EncodeToString(jti[:]), CallerKind: kind,
	}
	if kind == CallerSupervisor {
		c.Subject, c.SandboxID = SubjectPrefix+sandboxID, sandboxID
	}
	token, err = jwt.Signed(i.extSigner).Claims(c).Serialize()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sandbox jwt: sign extension token: %w", err)
	}
	return token, expiresAt, nil
}

// Key is one verification key.
type Key struct {
	KID    string
	Public ed25519.PublicKey
}

// Verifier checks sandbox tokens; it is an auth.Authenticator. It is safe
// for concurrent use.
type Verifier struct {
	keys     map[string]ed25519.PublicKey
	order    []Key
	audience string
	now      func() time.Time
}

var _ auth.Authenticator = (*Verifier)(nil)

// NewVerifier returns a verifier accepting tokens signed by any of keys for
// gatewayID.
func NewVerifier(gatewayID string, keys ...Key) (*Verifier, error) {
	if gatewayID == "" {
		return nil, errors.New("sandbox jwt: gateway id is required")
	}
	if len(keys) == 0 {
		return nil, errors.New("sandbox jwt: at least one verification key is required")
	}
	v := &Verifier{keys: make(map[string]ed25519.PublicKey), audience: Audience(gatewayID), now: time.Now}
	for _, k := range keys {
		if k.KID == "" || len(k.Public) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("sandbox jwt: invalid verification key %q", k.KID)
		}
		if _, dup := v.keys[k.KID]; dup {
			return nil, fmt.Errorf("sandbox jwt: duplicate kid %q", k.KID)
		}
		v.keys[k.KID] = k.Public
		v.order = append(v.order, k)
	}
	return v, nil
}

type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	Typ string `json:"typ"`
}

// Authenticate implements auth.Authenticator. Tokens that are not this
// gateway's (another kid, another algorithm, not a JWT) fall through.
func (v *Verifier) Authenticate(_ context.Context, req *auth.Request) (*auth.Principal, error) {
	tok := req.BearerToken()
	if tok == "" {
		return nil, nil
	}
	c, err := v.Verify(tok)
	if errors.Is(err, errNotMine) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &auth.Principal{
		Kind:        auth.KindSandbox,
		Source:      auth.SourceSandboxJWT,
		Subject:     c.Subject,
		DisplayName: c.Subject,
		SandboxID:   c.SandboxID,
	}, nil
}

var errNotMine = errors.New("not a sandbox token of this gateway")

func invalid(reason string) error { return errdefs.Unauthenticated("invalid token: " + reason) }

// Verify checks tok and returns its claims. Errors are Unauthenticated
// except for tokens that are not this gateway's, which return an error
// Authenticate treats as "not mine".
func (v *Verifier) Verify(tok string) (*Claims, error) {
	h, ok := parseHeader(tok)
	if !ok {
		return nil, errNotMine
	}
	if h.Typ == ExtensionTokenType {
		return nil, errdefs.Unauthenticated("extension tokens cannot authenticate to the gateway")
	}
	key, ok := v.keys[h.Kid]
	if h.Alg != string(jose.EdDSA) || !ok {
		return nil, errNotMine
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, invalid("malformed token")
	}
	var c Claims
	var raw map[string]json.RawMessage
	if err := parsed.Claims(key, &c, &raw); err != nil {
		return nil, invalid("signature verification failed")
	}
	for _, req := range []string{"sub", "iss", "aud", "exp", "sandbox_id"} {
		if _, ok := raw[req]; !ok {
			return nil, invalid("missing claim " + req)
		}
	}
	switch {
	case c.Issuer != v.audience:
		return nil, invalid("wrong issuer")
	case c.Audience != v.audience:
		return nil, invalid("wrong audience")
	case c.SandboxID == "" || c.Subject != SubjectPrefix+c.SandboxID:
		return nil, invalid("subject does not name the sandbox")
	}
	now := v.now()
	if c.Expiry != 0 && now.After(time.Unix(c.Expiry, 0).Add(Leeway)) {
		return nil, invalid("token expired")
	}
	if c.IssuedAt != 0 && time.Unix(c.IssuedAt, 0).After(now.Add(Leeway)) {
		return nil, invalid("token used before issued")
	}
	return &c, nil
}

func parseHeader(tok string) (header, bool) {
	var h header
	seg, _, ok := strings.Cut(tok, ".")
	if !ok || strings.Count(tok, ".") != 2 {
		return h, false
	}
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil || json.Unmarshal(b, &h) != nil {
		return h, false
	}
	return h, true
}

// JWKS returns the JSON Web Key Set of the verification keys, for
// /.well-known/jwks.json.
func (v *Verifier) JWKS() ([]byte, error) {
	set := jose.JSONWebKeySet{}
	for _, k := range v.order {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public, KeyID: k.KID, Algorithm: string(jose.EdDSA), Use: "sig"})
	}
	return json.Marshal(set)
}

// JWKSPath is where the gateway serves JWKS.
const JWKSPath = "/.well-known/jwks.json"

// Discovery returns the OIDC-shaped discovery document served at
// /.well-known/openid-configuration, with OpenShell's fields: issuer is the
// gateway identity openshell-gateway:<gateway_id> (the iss of every token
// this gateway mints, not the URL serving the document), jwks_uri is
// baseURL (scheme://authority, no trailing slash) + JWKSPath, and EdDSA is
// the only signing algorithm. It carries no key material.
func (v *Verifier) Discovery(baseURL string) ([]byte, error) {
	if baseURL == "" {
		return nil, errdefs.InvalidArgument("discovery needs the gateway's base url for an absolute jwks_uri")
	}
	return json.Marshal(struct {
		Issuer        string   `json:"issuer"`
		JWKSURI       string   `json:"jwks_uri"`
		Algs          []string `json:"id_token_signing_alg_values_supported"`
		ResponseTypes []string `json:"response_types_supported"`
		SubjectTypes  []string `json:"subject_types_supported"`
		Scopes        []string `json:"scopes_supported"`
		Claims        []string `json:"claims_supported"`
	}{
		Issuer:        v.audience,
		JWKSURI:       baseURL + JWKSPath,
		Algs:          []string{string(jose.EdDSA)},
		ResponseTypes: []string{"id_token"},
		SubjectTypes:  []string{"public"},
		Scopes:        []string{"openid"},
		Claims:        []string{"iss", "aud", "sub", "iat", "exp", "jti", "caller_kind", "sandbox_id"},
	})
}
