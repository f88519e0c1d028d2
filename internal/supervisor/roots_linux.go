package supervisor

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"hash/maphash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The places crypto/x509 reads the system roots from on Linux
// (root_linux.go, root_unix.go): the first bundle that exists, then every
// file of every directory; SSL_CERT_FILE and SSL_CERT_DIR replace them.
var (
	rootBundles = []string{
		"/etc/ssl/certs/ca-certificates.crt",
		"/etc/pki/tls/certs/ca-bundle.crt",
		"/etc/ssl/ca-bundle.pem",
		"/etc/pki/tls/cacert.pem",
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
		"/etc/ssl/cert.pem",
	}
	rootDirs = []string{"/etc/ssl/certs", "/etc/pki/tls/certs"}
)

// pendingRoots is the upstream root pool: its files read in the
// background from the start of Serve, its certificates parsed on first
// use (pool), off the path to READY.
type pendingRoots struct {
	read  chan struct{} // closed once files is set
	files [][]byte
	test  []*x509.Certificate
	pool  func() *x509.CertPool // parses once, on the first call
}

// waitRead returns once the files are read: a pivot_root may follow.
func (p *pendingRoots) waitRead() { <-p.read }

// wait returns the pool, parsing the certificates on the first call
// (the first TLS upstream of the egress proxy or the inference router).
func (p *pendingRoots) wait() *x509.CertPool { return p.pool() }

// loadUpstreamRoots reads the certificates of the system pool
// (x509.SystemCertPool's sources, so the same set) in the background;
// the caller waits for the reading (waitRead) before a pivot_root
// changes what those paths name. The certificates are parsed on the
// pool's first use: parsing is most of the cost (3.6-4.5 ms for a
// Debian bundle at load 4-5, the reading 1.3-1.6 ms) and no sandbox needs the
// roots before it is READY. The test-only CA file is read and parsed
// now. x509.SystemCertPool parses every file of /etc/ssl/certs, where
// the bundle and each of its certificates sit side by side, so it
// parses each root two or three times (8-25 ms per supervisor start);
// here a certificate is parsed once. A test CA file that cannot be read
// or holds no certificate is an error now; unreadable system places and
// certificates that do not parse are skipped as crypto/x509 skips them
// (an empty pool trusts nothing: every TLS upstream then fails
// verification).
func loadUpstreamRoots(testCAFile string) (*pendingRoots, error) {
	var test []*x509.Certificate
	if testCAFile != "" {
		b, err := os.ReadFile(testCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvEgressTestCAFile, err)
		}
		for _, der := range pemCertificates(b) {
			if c, err := x509.ParseCertificate(der); err == nil {
				test = append(test, c)
			}
		}
		if len(test) == 0 {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", EnvEgressTestCAFile, testCAFile)
		}
	}
	p := &pendingRoots{read: make(chan struct{}), test: test}
	p.pool = sync.OnceValue(p.parse)
	certFile, certDir := os.Getenv("SSL_CERT_FILE"), os.Getenv("SSL_CERT_DIR")
	go func() {
		defer close(p.read)
		p.files = systemRootFiles(certFile, certDir)
	}()
	return p, nil
}

// parse builds the pool of the files read and the test CA.
func (p *pendingRoots) parse() *x509.CertPool {
	<-p.read
	pool := x509.NewCertPool()
	for _, der := range rootDERs(p.files) {
		if c, err := x509.ParseCertificate(der); err == nil {
			pool.AddCert(c)
		}
	}
	for _, c := range p.test {
		pool.AddCert(c)
	}
	p.files = nil
	return pool
}

// systemRootDERs returns the distinct certificates (DER) of the places
// x509.SystemCertPool loads on Linux, in its order. certFile and certDir
// are SSL_CERT_FILE and SSL_CERT_DIR. Unreadable places are skipped, as
// there (an empty pool is no error here: the proxy then trusts nothing).
func systemRootDERs(certFile, certDir string) [][]byte {
	return rootDERs(systemRootFiles(certFile, certDir))
}

// systemRootFiles reads the files x509.SystemCertPool reads on Linux, in
// its order: the first bundle that can be read, then every file of the
// directories but the symlinks within them (c_rehash's hash links) and
// the bundle itself when it sits there. Only the reading happens before
// a pivot_root; rootDERs decodes later.
func systemRootFiles(certFile, certDir string) [][]byte {
	var out [][]byte
	files := rootBundles
	if certFile != "" {
		files = []string{certFile}
	}
	var bundle os.FileInfo
	for _, f := range files {
		if data, fi, err := readFileStat(f, nil); err == nil {
			bundle = fi
			out = append(out, data)
			break
		}
	}
	dirs := rootDirs
	if certDir != "" {
		dirs = strings.Split(certDir, ":")
	}
	for _, dir := range dirs {
		out = readDirFiles(dir, bundle, out)
	}
	return out
}

// readDirFiles appends to out the contents of the files of dir but the
// same-directory symlinks and the bundle, in name order. Names are
// resolved relative to the directory's descriptor (openat, readlinkat):
// a few hundred entries each spared the walk of dir's path.
func readDirFiles(dir string, bundle os.FileInfo, out [][]byte) [][]byte {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return out
	}
	defer unix.Close(dfd) //nolint:errcheck // read-only
	buf := make([]byte, unix.PathMax)
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink != 0 {
			n, err := unix.Readlinkat(dfd, e.Name(), buf)
			if err == nil && !strings.Contains(string(buf[:n]), "/") {
				continue // the hash links of c_rehash name a file read anyway
			}
		}
		fd, err := unix.Openat(dfd, e.Name(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), dir+"/"+e.Name())
		if data, _, err := readOpenFile(f, bundle); err == nil && data != nil {
			out = append(out, data)
		}
		_ = f.Close()
	}
	return out
}

// rootDERs returns the distinct CERTIFICATE blocks without headers (the
// blocks x509.CertPool.AppendCertsFromPEM takes) of files, in order.
func rootDERs(files [][]byte) [][]byte {
	// PEM text already decoded, by a seeded hash: whole files, and each
	// block's own text (from the end of the previous block through its
	// END line), which decodes alone to the same block. A file equal to
	// one of them adds nothing: c_rehash directories hold each bundle
	// entry again as a file of its own. (A hash collision could only
	// leave a root out, never add one.)
	seed := maphash.MakeSeed()
	done := map[uint64]bool{}
	seen := map[string]bool{}
	var out [][]byte
	for _, data := range files {
		h := maphash.Bytes(seed, data)
		if done[h] {
			continue
		}
		done[h] = true
		for rest := data; len(rest) > 0; {
			block, next := pem.Decode(rest)
			if block == nil {
				break
			}
			done[maphash.Bytes(seed, rest[:len(rest)-len(next)])] = true
			rest = next
			if block.Type != "CERTIFICATE" || len(block.Headers) != 0 || seen[string(block.Bytes)] {
				continue
			}
			seen[string(block.Bytes)] = true
			out = append(out, block.Bytes)
		}
	}
	return out
}

// readFileStat reads the file p unless it is skip (the same file: nil
// data then). It returns the file's FileInfo.
func readFileStat(p string, skip os.FileInfo) ([]byte, os.FileInfo, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	return readOpenFile(f, skip)
}

// readOpenFile is readFileStat of an open file.
func readOpenFile(f *os.File, skip os.FileInfo) ([]byte, os.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if skip != nil && os.SameFile(fi, skip) {
		return nil, fi, nil
	}
	data := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			return data, fi, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
	}
}

// sameDirSymlink reports whether e in dir is a symlink whose target has
// no slash (crypto/x509 skips these).
func sameDirSymlink(e fs.DirEntry, dir string) bool {
	if e.Type()&fs.ModeSymlink == 0 {
		return false
	}
	target, err := os.Readlink(filepath.Join(dir, e.Name()))
	return err == nil && !strings.Contains(target, "/")
}

// pemCertificates returns the DER of the CERTIFICATE blocks without
// headers in data, the blocks x509.CertPool.AppendCertsFromPEM takes.
func pemCertificates(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		out = append(out, block.Bytes)
	}
	return out
}
