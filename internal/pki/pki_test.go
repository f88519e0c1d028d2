package pki

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/errdefs"
)

func generateDir(t testing.TB, sans ...string) (string, *Report) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	rep, err := Ensure(t.Context(), Dir{Path: dir}, Options{ServerSANs: sans}, false)
	if err != nil {
		t.Fatalf("Ensure() = %v", err)
	}
	if rep.Outcome != Generated {
		t.Fatalf("Ensure() outcome = %v, want Generated", rep.Outcome)
	}
	return dir, rep
}

func snapshot(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, f := range DirFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = b
	}
	return out
}

func TestEnsureFreshWritesLayoutAndModes(t *testing.T) {
	dir, rep := generateDir(t)
	wantModes := map[string]os.FileMode{
		"ca.crt": 0o644, "ca.key": 0o600,
		"server/tls.crt": 0o644, "server/tls.key": 0o600,
		"client/tls.crt": 0o644, "client/tls.key": 0o600,
		"jwt/signing.pem": 0o600, "jwt/public.pem": 0o644, "jwt/kid": 0o644,
	}
	if len(wantModes) != len(DirFiles) {
		t.Fatalf("DirFiles has %d entries, test expects %d", len(DirFiles), len(wantModes))
	}
	for f, want := range wantModes {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("stat %s: %v", f, err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("mode of %s = %o, want %o", f, got, want)
		}
	}
	for _, d := range []string{".", "server", "client", "jwt"} {
		fi, err := os.Stat(filepath.Join(dir, d))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o700 {
			t.Errorf("mode of dir %s = %o, want 700", d, got)
		}
	}
	kid, err := os.ReadFile(filepath.Join(dir, "jwt/kid"))
	if err != nil {
		t.Fatal(err)
	}
	if string(kid) != rep.KID || len(rep.KID) != 32 {
		t.Errorf("kid file = %q, report kid = %q, want equal 32 hex chars", kid, rep.KID)
	}
}

func TestEnsureCompleteSkipsWithIdenticalBytes(t *testing.T) {
	dir, _ := generateDir(t)
	before := snapshot(t, dir)
	for _, dry := range []bool{false, true} {
		rep, err := Ensure(t.Context(), Dir{Path: dir}, Options{ServerSANs: []string{"other.example"}}, dry)
		if err != nil {
			t.Fatalf("Ensure(dry=%v) on complete dir = %v", dry, err)
		}
		if rep.Outcome != Skipped {
			t.Errorf("Ensure(dry=%v) outcome = %v, want Skipped", dry, rep.Outcome)
		}
	}
	after := snapshot(t, dir)
	for f := range before {
		if !bytes.Equal(before[f], after[f]) {
			t.Errorf("%s changed on a skipped run", f)
		}
	}
}

func TestEnsurePartialNamesMissingFiles(t *testing.T) {
	tests := []struct {
		name   string
		remove []string
	}{
		{"one key", []string{"server/tls.key"}},
		{"jwt bundle", []string{"jwt/signing.pem", "jwt/public.pem", "jwt/kid"}},
		{"ca", []string{"ca.crt", "ca.key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _ := generateDir(t)
			for _, f := range tt.remove {
				if err := os.Remove(filepath.Join(dir, f)); err != nil {
					t.Fatal(err)
				}
			}
			for _, dry := range []bool{false, true} {
				_, err := Ensure(t.Context(), Dir{Path: dir}, Options{}, dry)
				if err == nil {
					t.Fatalf("Ensure(dry=%v) on partial dir = nil, want error", dry)
				}
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Errorf("Ensure() error kind = %v, want FailedPrecondition", err)
				}
				msg := err.Error()
				if want := "missing " + strings.Join(tt.remove, ", ") + " ("; !strings.Contains(msg, want) {
					t.Errorf("Ensure() error = %q, want it to contain %q", msg, want)
				}
				if !strings.Contains(msg, "remove "+dir) || !strings.Contains(msg, "restore") {
					t.Errorf("Ensure() error = %q, want a recovery hint", msg)
				}
			}
			for _, f := range tt.remove {
				if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s was recreated on a partial dir", f)
				}
			}
		})
	}
}

func TestEnsureDryRunWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	rep, err := Ensure(t.Context(), Dir{Path: dir}, Options{}, true)
	if err != nil {
		t.Fatalf("Ensure(dry) = %v", err)
	}
	if rep.Outcome != WouldGenerate || len(rep.Items) != len(DirFiles) {
		t.Errorf("Ensure(dry) = %+v, want WouldGenerate with all items", rep)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dry run created %s", dir)
	}
}

func TestEnsureIntoExistingEmptyDir(t *testing.T) {
	dir := t.TempDir()
	rep, err := Ensure(t.Context(), Dir{Path: dir}, Options{}, false)
	if err != nil || rep.Outcome != Generated {
		t.Fatalf("Ensure(empty existing dir) = %+v, %v; want Generated", rep, err)
	}
}

func parseCert(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCertificatesVerify(t *testing.T) {
	dir, _ := generateDir(t, "gw.example.com", "10.1.2.3", "*.apps.example.com")
	roots, err := LoadCertPool(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ca := parseCert(t, filepath.Join(dir, "ca.crt"))
	if !ca.IsCA || ca.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("CA IsCA=%v alg=%v, want CA with ECDSA", ca.IsCA, ca.PublicKeyAlgorithm)
	}

	server := parseCert(t, filepath.Join(dir, "server/tls.crt"))
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "openshell.localhost", "foo.openshell.localhost", "gw.example.com", "10.1.2.3", "x.apps.example.com"} {
		_, err := server.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			t.Errorf("server cert Verify(%q) = %v", name, err)
		}
	}
	if _, err := server.Verify(x509.VerifyOptions{DNSName: "evil.example", Roots: roots}); err == nil {
		t.Errorf("server cert verified for evil.example, want failure")
	}

	client := parseCert(t, filepath.Join(dir, "client/tls.crt"))
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert Verify(ClientAuth) = %v", err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Errorf("client cert verified for ServerAuth, want failure")
	}
	if client.Subject.CommonName != "openshell-client" || len(client.Subject.OrganizationalUnit) != 1 || client.Subject.OrganizationalUnit[0] != "openshell-user" {
		t.Errorf("client subject = %v, want CN openshell-client OU openshell-user", client.Subject)
	}

	// A second, independent bundle's CA must not verify this one's certs.
	other, _ := generateDir(t)
	otherRoots, err := LoadCertPool(filepath.Join(other, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: otherRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Errorf("client cert verified against another CA")
	}
}

func TestKID(t *testing.T) {
	pub := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)).Public().(ed25519.PublicKey)
	// PKIX DER of an Ed25519 key: fixed SEQUENCE/OID prefix then the 32 key bytes.
	prefix, _ := hex.DecodeString("302a300506032b6570032100")
	sum := sha256.Sum256(append(prefix, pub...))
	want := hex.EncodeToString(sum[:16])
	if got := KID(pub); got != want {
		t.Errorf("KID() = %q, want %q", got, want)
	}
}

func TestLoadJWTKeys(t *testing.T) {
	dir, rep := generateDir(t)
	p := func(f string) string { return filepath.Join(dir, f) }
	priv, pub, kid, err := LoadJWTKeys(p("jwt/signing.pem"), p("jwt/public.pem"), p("jwt/kid"))
	if err != nil {
		t.Fatalf("LoadJWTKeys() = %v", err)
	}
	if kid != rep.KID || KID(pub) != kid {
		t.Errorf("LoadJWTKeys() kid = %q, want %q", kid, rep.KID)
	}
	msg := []byte("token")
	if !ed25519.Verify(pub, msg, ed25519.Sign(priv, msg)) {
		t.Errorf("loaded keys do not sign/verify")
	}

	other, _ := generateDir(t)
	if _, _, _, err := LoadJWTKeys(p("jwt/signing.pem"), filepath.Join(other, "jwt/public.pem"), p("jwt/kid")); err == nil || !strings.Contains(err.Error(), "does not match signing key") {
		t.Errorf("LoadJWTKeys(mismatched pair) = %v, want mismatch error", err)
	}
	if _, _, _, err := LoadJWTKeys(p("jwt/signing.pem"), p("jwt/public.pem"), filepath.Join(other, "jwt/kid")); err == nil || !strings.Contains(err.Error(), "does not match the public key") {
		t.Errorf("LoadJWTKeys(wrong kid) = %v, want kid error", err)
	}
	if _, _, _, err := LoadJWTKeys(p("ca.key"), p("jwt/public.pem"), p("jwt/kid")); err == nil || !strings.Contains(err.Error(), "not an Ed25519 key") {
		t.Errorf("LoadJWTKeys(ECDSA key) = %v, want not-Ed25519 error", err)
	}
}

// TestTLSConfigsHandshake runs real TLS handshakes over loopback.
func TestTLSConfigsHandshake(t *testing.T) {
	dir, _ := generateDir(t)
	other, _ := generateDir(t)
	p := func(d, f string) string { return filepath.Join(d, f) }
	serverCfg, err := ServerTLSConfig(p(dir, "server/tls.crt"), p(dir, "server/tls.key"), p(dir, "ca.crt"), true)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).HandshakeContext(context.Background())
			io.WriteString(c, "ok")
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })

	tests := []struct {
		name     string
		cert     string // client bundle dir, "" for none
		wantFail bool
	}{
		{"own client cert", dir, false},
		{"no client cert", "", true},
		{"client cert from another CA", other, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			certPath, keyPath := "", ""
			if tt.cert != "" {
				certPath, keyPath = p(tt.cert, "client/tls.crt"), p(tt.cert, "client/tls.key")
			}
			clientCfg, err := ClientTLSConfig(p(dir, "ca.crt"), certPath, keyPath, "localhost")
			if err != nil {
				t.Fatal(err)
			}
			conn, err := tls.Dial("tcp", ln.Addr().String(), clientCfg)
			if err == nil {
				// TLS 1.3: a rejected client certificate surfaces on first read.
				_, err = io.ReadAll(conn)
				conn.Close()
			}
			if (err != nil) != tt.wantFail {
				t.Errorf("handshake error = %v, wantFail %v", err, tt.wantFail)
			}
		})
	}

	// A client trusting another CA refuses the server.
	clientCfg, err := ClientTLSConfig(p(other, "ca.crt"), "", "", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := tls.Dial("tcp", ln.Addr().String(), clientCfg); err == nil {
		conn.Close()
		t.Errorf("client trusting another CA accepted the server")
	}
}
