package server

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/auth/sandboxjwt"
	"github.com/openshell-go/openshell/internal/compute"
)

func bearer(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func httpGet(t *testing.T, c *http.Client, url string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Proto
}

// TestSniffing serves plaintext and TLS clients, gRPC and HTTP (HTTP/1.1
// and HTTP/2), on one port.
func TestSniffing(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, true))

	grpcCases := []struct {
		name string
		tls  *tls.Config
	}{
		{"grpc-plaintext", nil},
		{"grpc-tls", f.clientTLS()},
		{"grpc-mtls", f.clientTLS(f.userCert)},
	}
	for _, tc := range grpcCases {
		t.Run(tc.name, func(t *testing.T) {
			c := openshellv1.NewOpenShellClient(dial(t, addr, tc.tls))
			got, err := c.Health(t.Context(), &openshellv1.HealthRequest{})
			if err != nil {
				t.Fatalf("Health() = %v", err)
			}
			if got.GetStatus() != openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY {
				t.Errorf("Health().Status = %v, want HEALTHY", got.GetStatus())
			}
			h, err := healthpb.NewHealthClient(dial(t, addr, tc.tls)).Check(t.Context(), &healthpb.HealthCheckRequest{})
			if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("grpc.health.v1 Check() = %v, %v, want SERVING", h, err)
			}
		})
	}

	h2c := &http.Protocols{}
	h2c.SetUnencryptedHTTP2(true)
	h2tls := &http.Protocols{}
	h2tls.SetHTTP2(true)
	h1 := &http.Protocols{}
	h1.SetHTTP1(true)
	httpCases := []struct {
		name      string
		scheme    string
		tr        *http.Transport
		wantProto string
	}{
		{"http1-plaintext", "http", &http.Transport{Protocols: h1}, "HTTP/1.1"},
		{"http2-plaintext", "http", &http.Transport{Protocols: h2c}, "HTTP/2.0"},
		{"http1-tls", "https", &http.Transport{Protocols: h1, TLSClientConfig: f.clientTLS()}, "HTTP/1.1"},
		{"http2-tls", "https", &http.Transport{Protocols: h2tls, TLSClientConfig: f.clientTLS()}, "HTTP/2.0"},
	}
	for _, tc := range httpCases {
		t.Run(tc.name, func(t *testing.T) {
			c := &http.Client{Transport: tc.tr, Timeout: 10 * time.Second}
			t.Cleanup(tc.tr.CloseIdleConnections)
			base := tc.scheme + "://" + addr
			for _, p := range []string{"/healthz", "/readyz", "/metrics", "/.well-known/jwks.json"} {
				code, body, proto := httpGet(t, c, base+p)
				if code != http.StatusOK || proto != tc.wantProto {
					t.Errorf("GET %s = %d %s, want 200 %s", p, code, proto, tc.wantProto)
				}
				if p == "/metrics" && !strings.Contains(body, "openshell_grpc_server_handled_total") {
					t.Errorf("GET /metrics lacks the RPC counter:\n%.500s", body)
				}
				if p == "/.well-known/jwks.json" && !strings.Contains(body, f.jwtKID) {
					t.Errorf("GET /.well-known/jwks.json = %s, want kid %s", body, f.jwtKID)
				}
			}
			if code, _, _ := httpGet(t, c, base+"/nope"); code != http.StatusNotFound {
				t.Errorf("GET /nope = %d, want 404", code)
			}
		})
	}
}

func TestJWKSServesVerificationKey(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	_, body, _ := httpGet(t, http.DefaultClient, "http://"+addr+"/.well-known/jwks.json")
	var set jose.JSONWebKeySet
	if err := json.Unmarshal([]byte(body), &set); err != nil {
		t.Fatalf("jwks = %q: %v", body, err)
	}
	if len(set.Keys) != 1 || set.Keys[0].KeyID != f.jwtKID || set.Keys[0].Algorithm != "EdDSA" {
		t.Fatalf("jwks keys = %+v, want one EdDSA key %s", set.Keys, f.jwtKID)
	}
	pub, ok := set.Keys[0].Key.(ed25519.PublicKey)
	if !ok || !pub.Equal(f.jwtKey.Public()) {
		t.Errorf("jwks key = %v, want the verification key", set.Keys[0].Key)
	}
}

func TestMTLSFromAnotherCARefused(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	// Present the foreign certificate even though the server's list of
	// acceptable CAs does not name its issuer.
	conf := f.clientTLS()
	conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &f.otherCert, nil }
	c := openshellv1.NewOpenShellClient(dial(t, addr, conf))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := c.GetCurrentUser(ctx, &openshellv1.GetCurrentUserRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("GetCurrentUser() with a foreign client certificate = %v, want Unavailable (handshake refused)", err)
	}
	// The trusted certificate still works on the same server.
	u, err := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS(f.userCert))).GetCurrentUser(t.Context(), &openshellv1.GetCurrentUserRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if u.GetSubject() != "alice" || u.GetIdentityProvider() != "mtls" {
		t.Errorf("GetCurrentUser() = %v, want alice via mtls", u)
	}
}

func TestRequireClientCertRefusesPlaintext(t *testing.T) {
	f := newFixture(t)
	opts := f.fullOptions(t, false)
	opts.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
	_, addr := startServer(t, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := openshellv1.NewOpenShellClient(dial(t, addr, nil)).Health(ctx, &openshellv1.HealthRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext Health() = %v, want Unavailable", err)
	}
	if _, err := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS(f.userCert))).Health(ctx, &openshellv1.HealthRequest{}); err != nil {
		t.Errorf("mTLS Health() = %v", err)
	}
}

func TestGetCurrentUser(t *testing.T) {
	f := newFixture(t)
	_, strict := startServer(t, f.fullOptions(t, false))
	_, allow := startServer(t, f.fullOptions(t, true))
	tok := f.oidc.token(t, "bob", []string{"openshell-user"}, "sandbox:read")
	tests := []struct {
		name string
		addr string
		tls  *tls.Config
		tok  string
		want *openshellv1.GetCurrentUserResponse
	}{
		{"mtls", strict, f.clientTLS(f.userCert), "", &openshellv1.GetCurrentUserResponse{
			Subject: "alice", DisplayName: "alice", Roles: []string{"openshell-user"}, IdentityProvider: "mtls"}},
		{"oidc", strict, f.clientTLS(), tok, &openshellv1.GetCurrentUserResponse{
			Subject: "bob", DisplayName: "Display bob", Roles: []string{"openshell-user"}, Scopes: []string{"sandbox:read"}, IdentityProvider: "oidc"}},
		{"local-dev", allow, nil, "", &openshellv1.GetCurrentUserResponse{
			Subject: auth.LocalDevSubject, DisplayName: auth.LocalDevSubject, Roles: []string{"openshell-user", "openshell-admin"},
			Scopes: []string{"openshell:all"}, IdentityProvider: "local_dev"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			if tc.tok != "" {
				ctx = bearer(ctx, tc.tok)
			}
			got, err := openshellv1.NewOpenShellClient(dial(t, tc.addr, tc.tls)).GetCurrentUser(ctx, &openshellv1.GetCurrentUserRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("GetCurrentUser() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetGatewayInfoAndDegradedHealth(t *testing.T) {
	opts := Options{Deps: Deps{
		Version: "v9.9.9",
		Status: func(context.Context) openshellv1.ServiceStatus {
			return openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED
		},
		Drivers: func(context.Context) ([]DriverInfo, error) {
			return []DriverInfo{{Name: "process", Capabilities: compute.Capabilities{DriverName: "process", DriverVersion: "1.2.3"}}}, nil
		},
	}}
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, nil))
	h, err := c.Health(t.Context(), &openshellv1.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&openshellv1.HealthResponse{Status: openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED, Version: "v9.9.9"}, h, protocmp.Transform()); diff != "" {
		t.Errorf("Health() (-want +got):\n%s", diff)
	}
	info, err := c.GetGatewayInfo(t.Context(), &openshellv1.GetGatewayInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &openshellv1.GetGatewayInfoResponse{
		Status: openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED, GatewayVersion: "v9.9.9",
		ComputeDrivers: []*openshellv1.ComputeDriverInfo{{Name: "process", Capabilities: &openshellv1.ComputeDriverCapabilities{DriverName: "process", DriverVersion: "1.2.3"}}},
	}
	if diff := cmp.Diff(want, info, protocmp.Transform()); diff != "" {
		t.Errorf("GetGatewayInfo() (-want +got):\n%s", diff)
	}
}

func signEd25519(t *testing.T, key ed25519.PrivateKey, kid, typ string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithHeader("kid", kid)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestSandboxTokenRejections sends bad sandbox tokens to a sandbox RPC of a
// gateway with every authenticator configured.
func TestSandboxTokenRejections(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	c := openshellv1.NewOpenShellClient(dial(t, addr, nil))
	aud := sandboxjwt.Audience(gatewayID)
	claims := func(exp int64) map[string]any {
		return map[string]any{"sub": sandboxjwt.SubjectPrefix + "sb1", "iss": aud, "aud": aud,
			"iat": time.Now().Unix() - 300, "exp": exp, "sandbox_id": "sb1"}
	}
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	wrongAud := claims(0)
	wrongAud["aud"] = "openshell-gateway:elsewhere"
	tests := []struct {
		name     string
		tok      string
		wantCode codes.Code
		wantMsg  string
	}{
		{"never-expires", signEd25519(t, f.jwtKey, f.jwtKID, "", claims(0)), codes.Unimplemented, ""},
		{"within-leeway", signEd25519(t, f.jwtKey, f.jwtKID, "", claims(time.Now().Unix()-30)), codes.Unimplemented, ""},
		{"expired", signEd25519(t, f.jwtKey, f.jwtKID, "", claims(time.Now().Unix()-120)), codes.Unauthenticated, "invalid token: token expired"},
		{"wrong-audience", signEd25519(t, f.jwtKey, f.jwtKID, "", wrongAud), codes.Unauthenticated, "invalid token: wrong audience"},
		{"bad-signature", signEd25519(t, otherKey, f.jwtKID, "", claims(0)), codes.Unauthenticated, "invalid token: signature verification failed"},
		{"extension-typ", signEd25519(t, f.jwtKey, f.jwtKID, sandboxjwt.ExtensionTokenType, claims(0)), codes.Unauthenticated, "extension tokens cannot authenticate to the gateway"},
		// Not this gateway's token: falls through to OIDC, which rejects it.
		{"wrong-kid", signEd25519(t, otherKey, "other-kid", "", claims(0)), codes.Unauthenticated, ""},
		{"garbage", "not-a-jwt", codes.Unauthenticated, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ReportPolicyStatus(bearer(t.Context(), tc.tok), &openshellv1.ReportPolicyStatusRequest{})
			st := status.Convert(err)
			if st.Code() != tc.wantCode || (tc.wantMsg != "" && st.Message() != tc.wantMsg) {
				t.Errorf("ReportPolicyStatus() = %v %q, want %v %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
			if strings.Contains(st.Message(), tc.tok) {
				t.Errorf("error message echoes the token")
			}
		})
	}
}

func TestOversizedMessage(t *testing.T) {
	_, addr := startServer(t, Options{})
	c := openshellv1.NewOpenShellClient(dial(t, addr, nil))
	big := strings.Repeat("x", DefaultMaxRecvMsgSize+1)
	_, err := c.CreateSandbox(t.Context(), &openshellv1.CreateSandboxRequest{Name: big})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreateSandbox(2 MiB) = %v, want ResourceExhausted", err)
	}
	if _, err := c.Health(t.Context(), &openshellv1.HealthRequest{}); err != nil {
		t.Errorf("Health() after an oversized message = %v", err)
	}
}

func TestGarbageConnectionClosed(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, true))
	for _, garbage := range []string{
		"GARBAGE \x00\x01\x02 NOT HTTP\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff",
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte(garbage)); err != nil {
			t.Fatal(err)
		}
		// The server answers at most an error and closes the connection.
		_, err = io.Copy(io.Discard, bufio.NewReader(conn))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("connection after %q stayed open", garbage)
		}
		_ = conn.Close()
	}
	if _, err := openshellv1.NewOpenShellClient(dial(t, addr, nil)).Health(t.Context(), &openshellv1.HealthRequest{}); err != nil {
		t.Errorf("Health() after garbage connections = %v", err)
	}
}

func TestRateLimit(t *testing.T) {
	_, addr := startServer(t, Options{RateLimit: RateLimit{Requests: 3, Window: time.Hour}})
	c := openshellv1.NewOpenShellClient(dial(t, addr, nil))
	for i := range 3 {
		if _, err := c.Health(t.Context(), &openshellv1.HealthRequest{}); err != nil {
			t.Fatalf("Health() #%d = %v", i+1, err)
		}
	}
	_, err := c.Health(t.Context(), &openshellv1.HealthRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Health() #4 = %v, want ResourceExhausted", err)
	}
	// HTTP is not rate limited.
	if code, _, _ := httpGet(t, http.DefaultClient, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", code)
	}
}

func TestReadinessAndSeparateListeners(t *testing.T) {
	ready := make(chan struct{})
	isReady := func(context.Context) error {
		select {
		case <-ready:
			return nil
		default:
			return errors.New("store: database unavailable")
		}
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startServer(t, Options{Ready: isReady, HealthListener: hl, MetricsListener: ml})
	for _, u := range []string{"http://" + addr + "/readyz", "http://" + hl.Addr().String() + "/readyz"} {
		if code, body, _ := httpGet(t, http.DefaultClient, u); code != http.StatusServiceUnavailable || body != "not ready: store: database unavailable\n" {
			t.Errorf("GET %s before ready = %d %q, want 503 with the reason", u, code, body)
		}
	}
	close(ready)
	for _, u := range []string{"http://" + addr + "/readyz", "http://" + hl.Addr().String() + "/readyz",
		"http://" + hl.Addr().String() + "/health", "http://" + ml.Addr().String() + "/metrics"} {
		if code, _, _ := httpGet(t, http.DefaultClient, u); code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", u, code)
		}
	}
	if code, _, _ := httpGet(t, http.DefaultClient, "http://"+ml.Addr().String()+"/readyz"); code != http.StatusNotFound {
		t.Errorf("GET /readyz on the metrics listener = %d, want 404", code)
	}
}

// TestCallbackListener checks that the Unix-socket listener serves only
// sandbox and dual RPCs.
func TestCallbackListener(t *testing.T) {
	f := newFixture(t)
	sock := filepath.Join(t.TempDir(), "cb.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	opts := f.fullOptions(t, true)
	opts.CallbackListener = ul
	startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, "unix://"+sock, nil))
	tok, _, err := f.issuer.Mint("sb1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := bearer(t.Context(), tok)
	if _, err := c.ReportPolicyStatus(ctx, &openshellv1.ReportPolicyStatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ReportPolicyStatus() over the callback socket = %v, want Unimplemented (past auth)", err)
	}
	if _, err := c.GetSandboxConfig(ctx, nil); status.Code(err) != codes.Unimplemented {
		t.Errorf("GetSandboxConfig() (dual) over the callback socket = %v, want Unimplemented (past auth)", err)
	}
	for name, call := range map[string]func() error{
		"Health": func() error { _, err := c.Health(ctx, &openshellv1.HealthRequest{}); return err },
		"GetCurrentUser": func() error {
			_, err := c.GetCurrentUser(t.Context(), &openshellv1.GetCurrentUserRequest{})
			return err
		},
		"CreateSandbox": func() error { _, err := c.CreateSandbox(t.Context(), &openshellv1.CreateSandboxRequest{}); return err },
	} {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s() over the callback socket = %v, want PermissionDenied", name, err)
		}
	}
}

// TestShutdownDrainsThenStops: a long stream (grpc health Watch) outlives
// the drain deadline, so Shutdown stops it hard; readiness drops first.
func TestShutdownDrainsThenStops(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context(), ln) }()
	addr := ln.Addr().String()
	cc := dial(t, addr, nil)
	w, err := healthpb.NewHealthClient(cc).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch().Recv() = %v, %v, want SERVING", m, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.draining.Load() || s.ready(t.Context()) == nil {
		t.Error("server still ready after Shutdown")
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 5*time.Second {
		t.Errorf("Shutdown took %v, want about the 200ms drain deadline", d)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			break
		}
		if m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Watch().Recv() during drain = %v, want NOT_SERVING", m.GetStatus())
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve() = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("listener still accepts after Shutdown")
	}
}

func TestRequestIDEchoed(t *testing.T) {
	_, addr := startServer(t, Options{})
	cc := dial(t, addr, nil)
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(t.Context(), auth.AuthSourceHeader, "oidc", RequestIDHeader, "req-123")
	if _, err := openshellv1.NewOpenShellClient(cc).Health(ctx, &openshellv1.HealthRequest{}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get(RequestIDHeader); len(got) != 1 || got[0] != "req-123" {
		t.Errorf("response %s = %v, want [req-123]", RequestIDHeader, got)
	}
}
