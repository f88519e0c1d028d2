package pki

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
)

// LoadJWTKeys reads the sandbox JWT key pair and kid written by
// generate-certs. It checks that the keys match and that the kid file equals
// KID(public key).
func LoadJWTKeys(signingPath, publicPath, kidPath string) (ed25519.PrivateKey, ed25519.PublicKey, string, error) {
	privDER, err := readPEM(signingPath, "PRIVATE KEY")
	if err != nil {
		return nil, nil, "", err
	}
	k, err := x509.ParsePKCS8PrivateKey(privDER)
	if err != nil {
		return nil, nil, "", fmt.Errorf("jwt signing key %s: %w", signingPath, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, nil, "", fmt.Errorf("jwt signing key %s: not an Ed25519 key", signingPath)
	}
	pubDER, err := readPEM(publicPath, "PUBLIC KEY")
	if err != nil {
		return nil, nil, "", err
	}
	p, err := x509.ParsePKIXPublicKey(pubDER)
	if err != nil {
		return nil, nil, "", fmt.Errorf("jwt public key %s: %w", publicPath, err)
	}
	pub, ok := p.(ed25519.PublicKey)
	if !ok {
		return nil, nil, "", fmt.Errorf("jwt public key %s: not an Ed25519 key", publicPath)
	}
	if !pub.Equal(priv.Public()) {
		return nil, nil, "", fmt.Errorf("jwt public key %s does not match signing key %s", publicPath, signingPath)
	}
	raw, err := os.ReadFile(kidPath)
	if err != nil {
		return nil, nil, "", fmt.Errorf("jwt kid: %w", err)
	}
	kid := strings.TrimSpace(string(raw))
	if want := KID(pub); kid != want {
		return nil, nil, "", fmt.Errorf("jwt kid %s: %q does not match the public key (want %q)", kidPath, kid, want)
	}
	return priv, pub, kid, nil
}

func readPEM(path, typ string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != typ {
		return nil, fmt.Errorf("%s: no %q PEM block", path, typ)
	}
	return block.Bytes, nil
}

// LoadCertPool reads a PEM bundle of CA certificates.
func LoadCertPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no PEM certificates", path)
	}
	return pool, nil
}

// ServerTLSConfig builds a TLS server configuration from a certificate and
// key. With clientCAPath set, client certificates are verified against it;
// requireClientCert decides whether one must be presented
// (tls.RequireAndVerifyClientCert) or may be (tls.VerifyClientCertIfGiven).
// NextProtos advertises h2 and http/1.1.
func ServerTLSConfig(certPath, keyPath, clientCAPath string, requireClientCert bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("tls server certificate %s / key %s: %w", certPath, keyPath, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}
	if clientCAPath != "" {
		pool, err := LoadCertPool(clientCAPath)
		if err != nil {
			return nil, fmt.Errorf("tls client ca: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, nil
}

// ClientTLSConfig builds a TLS client configuration trusting caPath (system
// roots when empty) and presenting certPath/keyPath when both are set.
// serverName overrides the name checked in the server certificate.
func ClientTLSConfig(caPath, certPath, keyPath, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caPath != "" {
		pool, err := LoadCertPool(caPath)
		if err != nil {
			return nil, fmt.Errorf("tls ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if (certPath == "") != (keyPath == "") {
		return nil, fmt.Errorf("tls client certificate and key must be given together")
	}
	if certPath != "" {
		cert, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("tls client certificate %s / key %s: %w", certPath, keyPath, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
