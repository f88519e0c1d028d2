package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

type testPKI struct {
	dir                     string
	caCert                  *x509.Certificate
	caKey                   *ecdsa.PrivateKey
	caPEM                   string
	serverCert              tls.Certificate
	clientCrt, clientKeyPEM string
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	var err error
	p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(caDER)
	p.caPEM = filepath.Join(p.dir, "ca.crt")
	writePEM(t, p.caPEM, "CERTIFICATE", caDER)

	issue := func(cn string, usage x509.ExtKeyUsage, serial int64) (certDER, keyDER []byte, key *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		certDER, err = x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err = x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return certDER, keyDER, key
	}
	sDER, _, sKey := issue("gateway", x509.ExtKeyUsageServerAuth, 2)
	p.serverCert = tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey}
	cDER, cKeyDER, _ := issue("alice", x509.ExtKeyUsageClientAuth, 3)
	p.clientCrt = filepath.Join(p.dir, "tls.crt")
	p.clientKeyPEM = filepath.Join(p.dir, "tls.key")
	writePEM(t, p.clientCrt, "CERTIFICATE", cDER)
	writePEM(t, p.clientKeyPEM, "EC PRIVATE KEY", cKeyDER)
	return p
}

// serveMTLS serves f over TLS requiring a client certificate from the CA.
func (p *testPKI) serveMTLS(t *testing.T, f *fakeGateway) string {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{p.serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	openshellv1.RegisterOpenShellServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return "https://" + ln.Addr().String()
}

func TestMTLSGateway(t *testing.T) {
	p := newTestPKI(t)
	ep := p.serveMTLS(t, listFake())
	tt := newTester(t)
	if r := tt.run("gateway", "add", "secure", "--endpoint", ep, "--ca", p.caPEM, "--cert", p.clientCrt, "--key", p.clientKeyPEM); r.err != nil {
		t.Fatal(r.err)
	}
	if r := tt.run("sandbox", "list", "--names"); r.err != nil || r.stdout != "alpha\nbeta-longer-name\n" {
		t.Errorf("list over mTLS = %q (%v)", r.stdout, r.err)
	}
	if r := tt.run("status"); r.err != nil || !strings.Contains(r.stdout, "Connected") {
		t.Errorf("status over mTLS = %q (%v)", r.stdout, r.err)
	}

	// Same endpoint without a client certificate: the handshake fails.
	tt2 := newTester(t)
	tt2.run("gateway", "add", "nocert", "--endpoint", ep, "--ca", p.caPEM)
	if r := tt2.run("sandbox", "list"); r.code() != 1 || !strings.Contains(r.err.Error(), `cannot reach gateway "nocert"`) || !strings.Contains(r.err.Error(), "client certificate") {
		t.Errorf("list without client cert = %v", r.err)
	}
	// Without the CA the server certificate is not trusted ...
	r := tt2.run("--gateway-endpoint", ep, "sandbox", "list")
	if r.code() != 1 || !strings.Contains(r.err.Error(), "certificate signed by unknown authority") || !strings.Contains(r.err.Error(), "--gateway-insecure") {
		t.Errorf("list without CA = %v", r.err)
	}

	// ... unless verification is off: --gateway-insecure or, as with
	// OpenShell's CLI, OPENSHELL_GATEWAY_INSECURE.
	tt2.env["OPENSHELL_GATEWAY_INSECURE"] = "true"
	if r := tt2.run("--gateway-endpoint", ep, "sandbox", "list"); r.err == nil || strings.Contains(r.err.Error(), "unknown authority") {
		t.Errorf("list with OPENSHELL_GATEWAY_INSECURE=true = %v, want past server verification (then refused for lack of a client certificate)", r.err)
	}
	if r := tt2.run("--gateway-insecure=false", "--gateway-endpoint", ep, "sandbox", "list"); r.err == nil || !strings.Contains(r.err.Error(), "unknown authority") {
		t.Errorf("--gateway-insecure=false must win over the environment: %v", r.err)
	}
	tt2.env["OPENSHELL_GATEWAY_INSECURE"] = "maybe"
	if r := tt2.run("--gateway-endpoint", ep, "sandbox", "list"); r.code() != 2 || !strings.Contains(r.err.Error(), `invalid OPENSHELL_GATEWAY_INSECURE="maybe"`) {
		t.Errorf("bad OPENSHELL_GATEWAY_INSECURE = %v", r.err)
	}

	// The local TLS directory is picked up when nothing is registered.
	tt3 := newTester(t)
	tlsDir := filepath.Join(tt3.env["XDG_STATE_HOME"], "openshell", "tls")
	for src, dst := range map[string]string{p.caPEM: "ca.crt", p.clientCrt: "client/tls.crt", p.clientKeyPEM: "client/tls.key"} {
		b, _ := os.ReadFile(src)
		writeFile(t, filepath.Join(tlsDir, dst), string(b))
	}
	tt3.setup = func(a *app) {}
	tgt := func() gatewayTarget {
		a := newApp(nil, &strings.Builder{}, &strings.Builder{})
		a.getenv = func(k string) string { return tt3.env[k] }
		a.lookupEnv = func(k string) (string, bool) { v, ok := tt3.env[k]; return v, ok }
		g, err := a.resolveGateway()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}()
	tgt.Endpoint = ep // the fake listens on a random port, not 17670
	target, creds, err := dialTarget(tgt)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := openshellv1.NewOpenShellClient(conn).Health(t.Context(), &openshellv1.HealthRequest{}); err != nil {
		t.Errorf("Health with local TLS material: %v", err)
	}
}

func TestUnixSocketEndpoint(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(srv, listFake())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	r := newTester(t).run("--gateway-endpoint", "unix://"+sock, "sandbox", "list", "--names")
	if r.err != nil || r.stdout != "alpha\nbeta-longer-name\n" {
		t.Errorf("list over unix socket = %q (%v)", r.stdout, r.err)
	}
}

// TestOIDCGatewayUsesStoredToken: a gateway registered by OpenShell's CLI
// with auth_mode "oidc" is called with the access token its 'gateway login'
// stored in oidc_token.json; a missing or expired token is an error naming
// the fix, and a rejected token makes status report "not authenticated".
func TestOIDCGatewayUsesStoredToken(t *testing.T) {
	p := newTestPKI(t)
	f := listFake()
	var mu sync.Mutex
	var seen []string
	f.getGatewayInfo = func(ctx context.Context, _ *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, strings.Join(md.Get("authorization"), ","))
		mu.Unlock()
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer good-token" {
			return nil, status.Error(codes.Unauthenticated, "invalid token: signature")
		}
		return &openshellv1.GetGatewayInfoResponse{GatewayVersion: "v1"}, nil
	}
	ep := p.serveMTLS(t, f)
	tt := newTester(t)
	dir := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways", "corp")
	writeFile(t, filepath.Join(dir, "metadata.json"), `{
  "name": "corp",
  "gateway_endpoint": "`+ep+`",
  "is_remote": true,
  "gateway_port": 0,
  "auth_mode": "oidc",
  "oidc_issuer": "https://idp.example/realms/openshell",
  "oidc_client_id": "openshell-cli"
}`)
	for src, dst := range map[string]string{p.caPEM: "ca.crt", p.clientCrt: "tls.crt", p.clientKeyPEM: "tls.key"} {
		b, _ := os.ReadFile(src)
		writeFile(t, filepath.Join(dir, "mtls", dst), string(b))
	}
	token := func(tok string, expiresAt time.Time) {
		writeFile(t, filepath.Join(dir, "oidc_token.json"), fmt.Sprintf(`{
  "access_token": %q,
  "expires_at": %d,
  "issuer": "https://idp.example/realms/openshell",
  "client_id": "openshell-cli"
}`, tok, expiresAt.Unix()))
	}

	if r := tt.run("--gateway", "corp", "sandbox", "list"); r.err == nil || !strings.Contains(r.err.Error(), "OIDC credentials for gateway \"corp\" are missing") {
		t.Errorf("sandbox list without a token = %v", r.err)
	}
	// status still probes the gateway, as OpenShell's does, and says why it
	// is not authenticated.
	if r := tt.run("--gateway", "corp", "status"); r.err != nil || !strings.Contains(r.stdout, "Status:     Connected\n") ||
		!strings.Contains(r.stdout, "Auth:       not authenticated: OIDC credentials for gateway \"corp\" are missing") ||
		!strings.Contains(r.stdout, "hint: log in with 'openshell gateway login corp'") {
		t.Errorf("status without a token = %q (%v)", r.stdout, r.err)
	}
	// Within OpenShell's 30 s margin and without a refresh token.
	token("good-token", fixedNow.Add(10*time.Second))
	if r := tt.run("--gateway", "corp", "sandbox", "list"); r.err == nil || !strings.Contains(r.err.Error(), "expired at") ||
		!strings.Contains(r.err.Error(), "log in again with 'openshell gateway login corp'") {
		t.Errorf("sandbox list with an expiring token = %v", r.err)
	}
	if r := tt.run("--gateway", "corp", "status"); r.err != nil || !strings.Contains(r.stdout, "Auth:       not authenticated: the OIDC access token for gateway \"corp\" expired at") {
		t.Errorf("status with an expiring token = %q (%v)", r.stdout, r.err)
	}
	token("good-token", fixedNow.Add(time.Hour))
	r := tt.run("--gateway", "corp", "status")
	if r.err != nil || !strings.Contains(r.stdout, "Auth:       authenticated\n") {
		t.Errorf("status with a good token = %q (%v)", r.stdout, r.err)
	}
	if r := tt.run("--gateway", "corp", "gateway", "info"); strings.Contains(r.stdout, "good-token") || !strings.Contains(r.stdout, "OIDC access token from") {
		t.Errorf("gateway info must name the token file, never the token: %q", r.stdout)
	}
	token("stale-token", fixedNow.Add(time.Hour))
	r = tt.run("--gateway", "corp", "status")
	if r.err != nil || !strings.Contains(r.stdout, "Auth:       not authenticated: invalid token: signature\n") ||
		!strings.Contains(r.stdout, "hint: the gateway did not accept the OIDC access token of gateway \"corp\"") {
		t.Errorf("status with a rejected token = %q (%v)", r.stdout, r.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"Bearer good-token", "Bearer stale-token"}, seen); diff != "" {
		t.Errorf("authorization headers (-want +got):\n%s", diff)
	}
}
