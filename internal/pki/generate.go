package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Identity facts shared with the auth packages.
const (
	// ClientCommonName is the CN of the generated client certificate; mTLS
	// authentication uses the CN as the principal subject.
	ClientCommonName = "openshell-client"
	// ClientRole is the OU of the generated client certificate; OU values
	// become the principal's roles.
	ClientRole = "openshell-user"
	// CACommonName and ServerCommonName name the other certificates.
	CACommonName     = "openshell-ca"
	ServerCommonName = "openshell-server"
	organization     = "openshell"
)

// DefaultServerSANs are always present in the server certificate.
var DefaultServerSANs = []string{"localhost", "127.0.0.1", "::1", "openshell.localhost", "*.openshell.localhost"}

// Default certificate lifetimes.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultLeafValidity = 5 * 365 * 24 * time.Hour
)

// Options tune Generate. The zero value is usable.
type Options struct {
	// ServerSANs are added to DefaultServerSANs (IP addresses become IP SANs).
	ServerSANs []string
	// Now is the issuance time (default time.Now).
	Now time.Time
	// CAValidity and LeafValidity default to DefaultCAValidity/DefaultLeafValidity.
	CAValidity, LeafValidity time.Duration
}

// Bundle is the generated material, PEM encoded.
type Bundle struct {
	CACert, CAKey         []byte
	ServerCert, ServerKey []byte
	ClientCert, ClientKey []byte
	// JWTSigningKey is a PKCS#8 "PRIVATE KEY" PEM of an Ed25519 key;
	// JWTPublicKey is its PKIX "PUBLIC KEY" PEM; KID its key id.
	JWTSigningKey, JWTPublicKey []byte
	KID                         string
}

// Generate creates a new CA, server and client certificates (ECDSA P-256)
// and an Ed25519 JWT key pair.
func Generate(opts Options) (*Bundle, error) {
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	caValidity, leafValidity := opts.CAValidity, opts.LeafValidity
	if caValidity <= 0 {
		caValidity = DefaultCAValidity
	}
	if leafValidity <= 0 {
		leafValidity = DefaultLeafValidity
	}
	notBefore := now.Add(-time.Hour) // tolerate small clock skew

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: CACommonName, Organization: []string{organization}},
		NotBefore:             notBefore,
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, caCert, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("sign ca: %w", err)
	}

	dns, ips := splitSANs(append(slices.Clone(DefaultServerSANs), opts.ServerSANs...))
	serverTmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: ServerCommonName, Organization: []string{organization}},
		NotBefore:   notBefore,
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    dns,
		IPAddresses: ips,
	}
	serverCert, serverKey, err := leaf(serverTmpl, caCert, caKey)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}

	clientTmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: ClientCommonName, OrganizationalUnit: []string{ClientRole}, Organization: []string{organization}},
		NotBefore:   notBefore,
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	clientCert, clientKey, err := leaf(clientTmpl, caCert, caKey)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}

	caKeyPEM, err := privateKeyPEM(caKey)
	if err != nil {
		return nil, err
	}
	b := &Bundle{
		CACert:     pemBlock("CERTIFICATE", caDER),
		CAKey:      caKeyPEM,
		ServerCert: serverCert,
		ServerKey:  serverKey,
		ClientCert: clientCert,
		ClientKey:  clientKey,
	}
	if b.JWTSigningKey, b.JWTPublicKey, b.KID, err = GenerateJWTKey(); err != nil {
		return nil, err
	}
	return b, nil
}

// GenerateJWTKey creates an Ed25519 key pair and returns the PKCS#8 private
// key PEM, the PKIX public key PEM and the kid.
func GenerateJWTKey() (signingPEM, publicPEM []byte, kid string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, "", fmt.Errorf("generate jwt key: %w", err)
	}
	signingPEM, err = privateKeyPEM(priv)
	if err != nil {
		return nil, nil, "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, "", fmt.Errorf("marshal jwt public key: %w", err)
	}
	return signingPEM, pemBlock("PUBLIC KEY", pubDER), KID(pub), nil
}

// KID is the key id of an Ed25519 public key: the lowercase hex of the first
// 16 bytes of the SHA-256 of its PKIX (SubjectPublicKeyInfo) DER.
func KID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		// Only possible for a key of the wrong length.
		return ""
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:16])
}

func splitSANs(names []string) (dns []string, ips []net.IP) {
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
			continue
		}
		if n != "" && !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	return dns, ips
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func sign(tmpl, parent *x509.Certificate, pub any, signer any) ([]byte, *x509.Certificate, error) {
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = sn
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return der, cert, nil
}

func leaf(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, _, err := sign(tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = privateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

func privateKeyPEM(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
