package supervisor_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
	"github.com/openshell-go/openshell/internal/supervisor"
)

// selfSigned returns a server TLS config for 127.0.0.1 and the path of its
// certificate as a CA bundle.
func selfSigned(t testing.TB) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "openshell-test-gateway"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, caFile
}

func TestEndpoints(t *testing.T) {
	t.Run("http", func(t *testing.T) {
		gw := relaytest.Start(t, relaytest.Options{TCP: true})
		startSupervisor(t, gw, "sb-http", nil)
		if got, err := execIn(t, gw, "sb-http", sshexec.Request{Command: []string{"echo", "http"}}); err != nil || got.stdout != "http\n" {
			t.Fatalf("exec = %+v, %v", got, err)
		}
	})
	t.Run("https", func(t *testing.T) {
		serverTLS, caFile := selfSigned(t)
		gw := relaytest.Start(t, relaytest.Options{TCP: true, TLS: serverTLS})
		startSupervisor(t, gw, "sb-https", func(c *supervisor.Config) { c.TLSCA = caFile })
		if got, err := execIn(t, gw, "sb-https", sshexec.Request{Command: []string{"echo", "tls"}}); err != nil || got.stdout != "tls\n" {
			t.Fatalf("exec = %+v, %v", got, err)
		}
	})
	t.Run("https with an untrusted gateway gives up", func(t *testing.T) {
		serverTLS, _ := selfSigned(t)
		_, otherCA := selfSigned(t)
		gw := relaytest.Start(t, relaytest.Options{TCP: true, TLS: serverTLS})
		cfg := supervisor.Config{
			Endpoint: gw.Endpoint(), SandboxID: "sb-x", Token: gw.AddSandbox("sb-x"), TLSCA: otherCA,
			NoMainProcess: true, StartupTimeout: 700 * time.Millisecond,
		}
		if err := supervisor.Serve(t.Context(), cfg, os.Stdout, testWriter(t)); err == nil {
			t.Fatal("Serve() with an untrusted gateway certificate = nil error")
		}
	})
}
