package server

import (
	"bufio"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

const discoveryPath = "/.well-known/openid-configuration"

// discoveryDoc is what a verifier reads from the discovery document.
type discoveryDoc struct {
	Issuer  string   `json:"issuer"`
	JWKSURI string   `json:"jwks_uri"`
	Algs    []string `json:"id_token_signing_alg_values_supported"`
}

// getDiscovery fetches the discovery document from base with hdr set and
// checks the response headers.
func getDiscovery(t *testing.T, c *http.Client, base string, hdr map[string]string) (discoveryDoc, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+discoveryPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v // net/http sends req.Host, not a Host header entry
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s, want 200", req.URL, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=300" {
		t.Errorf("Cache-Control = %q, want public, max-age=300", cc)
	}
	if v := resp.Header.Get("Vary"); v != "Host, X-Forwarded-Proto" {
		t.Errorf("Vary = %q, want Host, X-Forwarded-Proto", v)
	}
	var d discoveryDoc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("discovery %q: %v", b, err)
	}
	return d, string(b)
}

// TestDiscoveryLeadsAVerifierToTheKey: a client holding no credential and
// knowing only the gateway's URL fetches /.well-known/openid-configuration,
// follows jwks_uri and verifies an extension token the gateway minted; the
// issuer it learns is the token's iss. Neither document carries private
// key material.
func TestDiscoveryLeadsAVerifierToTheKey(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	c := &http.Client{Timeout: 10 * time.Second}
	d, raw := getDiscovery(t, c, "http://"+addr, nil)
	if d.Issuer != "openshell-gateway:"+gatewayID || d.JWKSURI != "http://"+addr+"/.well-known/jwks.json" || !slices.Equal(d.Algs, []string{"EdDSA"}) {
		t.Fatalf("discovery = %s, want issuer openshell-gateway:%s, jwks_uri on http://%s, algs [EdDSA]", raw, gatewayID, addr)
	}
	code, jwks, _ := httpGet(t, c, d.JWKSURI)
	if code != http.StatusOK {
		t.Fatalf("GET jwks_uri = %d", code)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal([]byte(jwks), &set); err != nil {
		t.Fatal(err)
	}

	tok, _, err := f.issuer.MintExtension("urn:openshell:extension:interceptor:guard", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(d.Algs[0])})
	if err != nil {
		t.Fatal(err)
	}
	keys := set.Key(parsed.Headers[0].KeyID)
	if len(keys) != 1 {
		t.Fatalf("jwks_uri has %d keys for kid %q", len(keys), parsed.Headers[0].KeyID)
	}
	var claims jwt.Claims
	if err := parsed.Claims(keys[0].Key, &claims); err != nil {
		t.Fatalf("extension token does not verify with the key found through discovery: %v", err)
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: d.Issuer, AnyAudience: jwt.Audience{"urn:openshell:extension:interceptor:guard"}, Time: time.Now()}, 0); err != nil {
		t.Errorf("claims against the discovered issuer: %v", err)
	}

	// Public keys only: every JWK member is a public one, and the private
	// key (seed or whole) appears in neither document.
	var rawSet struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal([]byte(jwks), &rawSet); err != nil {
		t.Fatal(err)
	}
	public := []string{"kty", "crv", "x", "kid", "alg", "use"}
	for _, k := range rawSet.Keys {
		for member := range k {
			if !slices.Contains(public, member) {
				t.Errorf("JWK member %q is not a public-key member (%s)", member, jwks)
			}
		}
	}
	for _, secret := range [][]byte{f.jwtKey.Seed(), f.jwtKey} {
		for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.StdEncoding} {
			if s := enc.EncodeToString(secret); strings.Contains(jwks, s) || strings.Contains(raw, s) {
				t.Errorf("private key material in the published documents")
			}
		}
	}
	if pub, ok := keys[0].Key.(ed25519.PublicKey); !ok || !pub.Equal(f.jwtKey.Public()) {
		t.Errorf("jwks_uri key = %v, want the gateway's public key", keys[0].Key)
	}
}

// TestDiscoveryJWKSURI: jwks_uri is absolute and follows how the client
// reached the gateway: the connection's scheme, the Host it sent, a
// TLS-terminating proxy's X-Forwarded-Proto (http or https only). No
// client presents a credential; without a Host the request is refused.
func TestDiscoveryJWKSURI(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	plain := &http.Client{Timeout: 10 * time.Second}
	tlsc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: f.clientTLS()}} // no client certificate
	t.Cleanup(tlsc.CloseIdleConnections)
	for _, tc := range []struct {
		name   string
		c      *http.Client
		scheme string
		hdr    map[string]string
		want   string
	}{
		{"plaintext", plain, "http", nil, "http://" + addr},
		{"tls without a client certificate", tlsc, "https", nil, "https://" + addr},
		{"forwarded https", plain, "http", map[string]string{"X-Forwarded-Proto": "https, http"}, "https://" + addr},
		{"forwarded junk ignored", plain, "http", map[string]string{"X-Forwarded-Proto": "javascript"}, "http://" + addr},
		{"host header", plain, "http", map[string]string{"Host": "gateway.example:8443"}, "http://gateway.example:8443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, raw := getDiscovery(t, tc.c, tc.scheme+"://"+addr, tc.hdr)
			if d.JWKSURI != tc.want+"/.well-known/jwks.json" {
				t.Errorf("jwks_uri in %s, want %s/.well-known/jwks.json", raw, tc.want)
			}
		})
	}

	// HTTP/1.0 without Host: no absolute jwks_uri can be built.
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET "+discoveryPath+" HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("discovery without Host = %d, want 400", resp.StatusCode)
	}
}

// TestDiscoveryWithoutKeys: a gateway without sandbox JWT keys has no
// issuer to publish.
func TestDiscoveryWithoutKeys(t *testing.T) {
	f := newFixture(t)
	opts := f.fullOptions(t, false)
	opts.JWKS, opts.Discovery = nil, nil
	_, addr := startServer(t, opts)
	if code, _, _ := httpGet(t, &http.Client{Timeout: 10 * time.Second}, "http://"+addr+discoveryPath); code != http.StatusNotFound {
		t.Errorf("discovery without keys = %d, want 404", code)
	}
}
