package server

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/auth/mtls"
	"github.com/openshell-go/openshell/internal/auth/oidc"
	"github.com/openshell-go/openshell/internal/auth/sandboxjwt"
)

// testCA is a certificate authority made in-test.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

func newCA(tb testing.TB, name string) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a leaf certificate for a server (with IP/DNS SANs) or a
// client (CN and OU).
func (ca *testCA) issue(tb testing.TB, cn string, ou []string, server bool) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, OrganizationalUnit: ou},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// oidcIssuer is an in-process OpenID provider: discovery + JWKS over TLS.
type oidcIssuer struct {
	srv    *httptest.Server
	key    *rsa.PrivateKey
	signer jose.Signer
}

const oidcAudience = "openshell-cli"

func newOIDCIssuer(tb testing.TB) *oidcIssuer {
	tb.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	o := &oidcIssuer{key: key}
	mux := http.NewServeMux()
	o.srv = httptest.NewTLSServer(mux)
	tb.Cleanup(o.srv.Close)
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                o.srv.URL,
			"jwks_uri":                              o.srv.URL + "/jwks",
			"authorization_endpoint":                o.srv.URL + "/auth",
			"token_endpoint":                        o.srv.URL + "/token",
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "rsa1", Algorithm: "RS256", Use: "sig"}}})
	})
	o.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "rsa1"))
	if err != nil {
		tb.Fatal(err)
	}
	return o
}

// token signs a token for subject with the given roles (realm_access.roles)
// and space-separated scopes.
func (o *oidcIssuer) token(tb testing.TB, subject string, roles []string, scope string) string {
	tb.Helper()
	now := time.Now()
	claims := map[string]any{
		"iss":          o.srv.URL,
		"aud":          oidcAudience,
		"sub":          subject,
		"iat":          now.Unix(),
		"exp":          now.Add(time.Hour).Unix(),
		"name":         "Display " + subject,
		"realm_access": map[string]any{"roles": roles},
		"scope":        scope,
	}
	tok, err := jwt.Signed(o.signer).Claims(claims).Serialize()
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// fixture is the material shared by the tests of one run.
type fixture struct {
	ca, otherCA     *testCA
	serverCert      tls.Certificate
	userCert        tls.Certificate
	otherCert       tls.Certificate
	jwtKey          ed25519.PrivateKey
	jwtKID          string
	issuer          *sandboxjwt.Issuer
	verifier        *sandboxjwt.Verifier
	oidc            *oidcIssuer
	oidcHTTPClient  *http.Client
	authorizerOpts  auth.AuthorizerOptions
	oidcAuthOptions oidc.Options
}

const gatewayID = "test-gw"

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	f := &fixture{ca: newCA(tb, "test-ca"), otherCA: newCA(tb, "other-ca")}
	f.serverCert = f.ca.issue(tb, "openshell-server", nil, true)
	f.userCert = f.ca.issue(tb, "alice", []string{"openshell-user"}, false)
	f.otherCert = f.otherCA.issue(tb, "mallory", []string{"openshell-admin"}, false)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	f.jwtKey = priv
	f.jwtKID, err = sandboxjwt.KeyID(priv.Public().(ed25519.PublicKey))
	if err != nil {
		tb.Fatal(err)
	}
	f.issuer, err = sandboxjwt.NewIssuer(priv, f.jwtKID, gatewayID, 0)
	if err != nil {
		tb.Fatal(err)
	}
	f.verifier, err = sandboxjwt.NewVerifier(gatewayID, sandboxjwt.Key{KID: f.jwtKID, Public: priv.Public().(ed25519.PublicKey)})
	if err != nil {
		tb.Fatal(err)
	}
	f.oidc = newOIDCIssuer(tb)
	f.oidcHTTPClient = f.oidc.srv.Client()
	f.authorizerOpts = auth.AuthorizerOptions{OIDC: true, AdminRole: auth.DefaultAdminRole, UserRole: auth.DefaultUserRole, Scopes: true}
	f.oidcAuthOptions = oidc.Options{
		Issuer: f.oidc.srv.URL, Audience: oidcAudience, RolesClaim: "realm_access.roles",
		ScopesClaim: "scope", HTTPClient: f.oidcHTTPClient,
	}
	return f
}

// serverTLS is the gateway's TLS config: client certificates optional.
func (f *fixture) serverTLS() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{f.serverCert},
		ClientCAs:    f.ca.pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS12,
	}
}

// fullOptions configures every authenticator (sandbox JWT, OIDC, mTLS).
func (f *fixture) fullOptions(tb testing.TB, allowUnauthenticated bool) Options {
	tb.Helper()
	oa, err := oidc.New(f.oidcAuthOptions)
	if err != nil {
		tb.Fatal(err)
	}
	authz, err := auth.NewAuthorizer(f.authorizerOpts)
	if err != nil {
		tb.Fatal(err)
	}
	return Options{
		Logger:    testLogger(tb),
		TLSConfig: f.serverTLS(),
		Authenticator: auth.NewChain(auth.ChainOptions{
			SandboxJWT:           f.verifier,
			OIDC:                 oa,
			MTLS:                 mtls.Authenticator{},
			AllowUnauthenticated: allowUnauthenticated,
		}),
		Authorizer: authz,
		JWKS:       f.verifier.JWKS,
		Discovery:  f.verifier.Discovery,
	}
}

func testLogger(tb testing.TB) *slog.Logger {
	if t, ok := tb.(*testing.T); ok {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

// startServer serves opts on a loopback port until the test ends.
func startServer(tb testing.TB, opts Options) (*Server, string) {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background(), ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		if err := <-done; err != nil {
			tb.Errorf("Serve() = %v", err)
		}
	})
	return s, ln.Addr().String()
}

// dial returns a client connection; tlsConf nil dials plaintext.
func dial(tb testing.TB, addr string, tlsConf *tls.Config, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	creds := insecure.NewCredentials()
	if tlsConf != nil {
		creds = credentials.NewTLS(tlsConf)
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clientTLS trusts the test CA and presents certs, if any.
func (f *fixture) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: f.ca.pool, Certificates: certs, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}
