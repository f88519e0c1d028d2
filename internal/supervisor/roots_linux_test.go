package supervisor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// poolOf parses ders into a pool.
func poolOf(t *testing.T, ders [][]byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, der := range ders {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		pool.AddCert(c)
	}
	return pool
}

// TestSystemRootDERsMatchesSystemCertPool: the supervisor's own reading
// of the system roots yields exactly x509.SystemCertPool's certificates
// on this host.
func TestSystemRootDERsMatchesSystemCertPool(t *testing.T) {
	sys, err := x509.SystemCertPool()
	if err != nil {
		t.Fatal(err)
	}
	ders := systemRootDERs(os.Getenv("SSL_CERT_FILE"), os.Getenv("SSL_CERT_DIR"))
	if len(ders) == 0 {
		t.Fatal("no system roots read on this host")
	}
	if !poolOf(t, ders).Equal(sys) {
		t.Fatalf("%d roots read, x509.SystemCertPool has %d subjects: the sets differ", len(ders), len(sys.Subjects())) //nolint:staticcheck // Subjects only counts here
	}
	seen := map[string]bool{}
	for _, d := range ders {
		if seen[string(d)] {
			t.Fatal("a root is returned twice")
		}
		seen[string(d)] = true
	}
}

func testCertPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// referencePool loads like crypto/x509's loadSystemRoots on Linux, with
// AppendCertsFromPEM on every file.
func referencePool(certFile string, dirs []string) *x509.CertPool {
	pool := x509.NewCertPool()
	if b, err := os.ReadFile(certFile); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	for _, dir := range dirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if sameDirSymlink(e, dir) {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
				pool.AppendCertsFromPEM(b)
			}
		}
	}
	return pool
}

// TestSystemRootDERsSkipsOnlyDuplicates builds a c_rehash-style layout:
// a bundle, its entries again as files (with and without a trailing
// newline, and with text around), hash links, a certificate only in the
// directory, a second directory, PEM with headers and other blocks, and
// checks the set against crypto/x509's way of loading.
func TestSystemRootDERsSkipsOnlyDuplicates(t *testing.T) {
	dir := t.TempDir()
	a, b, c, d := testCertPEM(t, "a"), testCertPEM(t, "b"), testCertPEM(t, "c"), testCertPEM(t, "d")
	certs := filepath.Join(dir, "certs")
	other := filepath.Join(dir, "other")
	for _, p := range []string{certs, other} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bundle := filepath.Join(certs, "ca-certificates.crt")
	write := func(p string, data []byte) {
		t.Helper()
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	withHeaders := strings.Replace(string(testCertPEM(t, "headers")), "-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1)
	write(bundle, append(append(append([]byte{}, a...), b...), withHeaders...))
	write(filepath.Join(certs, "a.pem"), a)
	write(filepath.Join(certs, "b.pem"), []byte(strings.TrimSuffix(string(b), "\n")))
	write(filepath.Join(certs, "b-again.pem"), append([]byte("# comment\n"), b...))
	write(filepath.Join(certs, "c.pem"), c)
	write(filepath.Join(certs, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	write(filepath.Join(certs, "junk"), []byte("not pem"))
	write(filepath.Join(other, "d.crt"), d)
	if err := os.Symlink("c.pem", filepath.Join(certs, "1234abcd.0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "d.crt"), filepath.Join(certs, "d-link.pem")); err != nil {
		t.Fatal(err)
	}

	ders := systemRootDERs(bundle, certs+":"+other)
	if len(ders) != 4 {
		t.Fatalf("got %d certificates, want 4 (a, b, c, d)", len(ders))
	}
	if !poolOf(t, ders).Equal(referencePool(bundle, []string{certs, other})) {
		t.Fatal("the set differs from crypto/x509's loading of the same files")
	}
	// SSL_CERT_FILE replaces the bundle list: a missing one adds nothing.
	if got := systemRootDERs(filepath.Join(dir, "missing"), other); len(got) != 1 {
		t.Fatalf("got %d certificates, want 1 (d)", len(got))
	}
}

// TestLoadUpstreamRootsTestCA: the test-only CA joins the pool; a file
// without a certificate is refused at once.
func TestLoadUpstreamRootsTestCA(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, testCertPEM(t, "test ca"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := loadUpstreamRoots(ca)
	if err != nil {
		t.Fatal(err)
	}
	want, err := x509.SystemCertPool()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(ca)
	want.AppendCertsFromPEM(b)
	if !p.wait().Equal(want) {
		t.Fatal("pool is not the system roots plus the test CA")
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadUpstreamRoots(empty); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Fatalf("err = %v, want a refusal of the empty CA file", err)
	}
	if _, err := loadUpstreamRoots(filepath.Join(dir, "missing.pem")); err == nil {
		t.Fatal("a missing test CA file is accepted")
	}
}

// TestUpstreamRootsParsedOnFirstUse: loading reads the files and parses
// nothing; the first wait parses them, once, into the pool the later
// calls return.
func TestUpstreamRootsParsedOnFirstUse(t *testing.T) {
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(bundle, testCertPEM(t, "root a"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", bundle)
	t.Setenv("SSL_CERT_DIR", filepath.Join(dir, "none"))
	p, err := loadUpstreamRoots("")
	if err != nil {
		t.Fatal(err)
	}
	p.waitRead()
	if len(p.files) != 1 {
		t.Fatalf("read %d files before first use, want the bundle unparsed", len(p.files))
	}
	// The files were read before a pivot_root: removing them now
	// changes nothing.
	if err := os.Remove(bundle); err != nil {
		t.Fatal(err)
	}
	pool := p.wait()
	if p.files != nil {
		t.Error("the files' bytes are kept after parsing")
	}
	if got := pool.Subjects(); len(got) != 1 { //nolint:staticcheck // only to count the roots
		t.Fatalf("pool holds %d roots, want 1", len(got))
	}
	if p.wait() != pool {
		t.Error("a second wait built another pool")
	}
}

// BenchmarkSystemRootFiles times reading the system roots' files, the
// part of the roots a pivot_root waits for.
func BenchmarkSystemRootFiles(b *testing.B) {
	for b.Loop() {
		if len(systemRootFiles("", "")) == 0 {
			b.Skip("no system roots on this machine")
		}
	}
}
