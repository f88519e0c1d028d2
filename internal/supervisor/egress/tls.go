package egress

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// CA is the sandbox's TLS interception authority: an ECDSA P-256 key
// made in memory (never written anywhere) and a self-signed certificate
// that agent processes trust, with which the proxy mints a leaf
// certificate per host (cached) for endpoints with tls: terminate.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA makes a CA valid from now for ten years.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sandbox ca key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"OpenShell sandbox"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sandbox ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, der: der, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA certificate (never the key), PEM encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Certificate is the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// maxLeaves bounds the leaf cache; past it the cache starts over.
const maxLeaves = 1024

// leaf returns the cached leaf certificate for host, minting it first.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(0, 0, 30),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: key}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}

// inspected reports whether decisions carry REST endpoints, whose rules
// then apply to each HTTP request.
func inspected(decisions []Decision) bool {
	for _, d := range decisions {
		if len(d.l7) > 0 {
			return true
		}
	}
	return false
}

// inspectTunnel reports whether a CONNECT tunnel with these decisions is
// inspected: it carries a REST endpoint without tls skip. When every REST
// endpoint says tls skip the tunnel is relayed as it is (OpenShell: skip
// disables TLS detection, so nothing inside is parsed).
func inspectTunnel(decisions []Decision) bool {
	for _, d := range decisions {
		for _, l := range d.l7 {
			if !l.tlsSkip {
				return true
			}
		}
	}
	return false
}

// skipped reports whether decisions carry REST endpoints whose rules a
// tls skip tunnel leaves unapplied.
func skipped(decisions []Decision) bool {
	return inspected(decisions) && !inspectTunnel(decisions)
}

// serveInspected serves an allowed CONNECT tunnel to host:port whose
// endpoints have protocol rest, upstream either raw (the dialed, tracked
// TCP connection) or pooled (an idle TLS connection to host:port the
// current policy admits); it owns both and answers the CONNECT. As in
// OpenShell, TLS is detected from the first byte the agent sends: TLS is
// terminated with a leaf of the sandbox CA (HTTP/1.1 only) and re-opened
// upstream, verified against Config.UpstreamRoots (nil: the system roots),
// or taken from the pool; anything else is read as plain HTTP/1.1 (a
// pooled TLS connection then goes back and a TCP one is dialed). Either
// way each request is decided by the REST rules and forwarded as a plain
// http:// request is, and a clean upstream connection is pooled at the
// end. authority is the CONNECT target.
func (p *Proxy) serveInspected(c net.Conn, br *bufio.Reader, raw net.Conn, pooled *upConn, decisions []Decision, host string, port uint32, authority string, connEv Event) {
	var upc *upConn // where requests go, owned here
	clean, isTLS := false, false
	defer func() {
		if upc != nil {
			pool := &p.pool
			if isTLS {
				pool = &p.tlsPool
			}
			p.releaseTo(pool, upc, clean)
		}
		if raw != nil && (upc == nil || upc.tracked != raw) {
			raw.Close()
			p.untrack(raw)
		}
		if pooled != nil && upc != pooled {
			p.releaseTo(&p.tlsPool, pooled, true)
		}
	}()
	// upErr is a failed upstream TLS handshake: answered with 502 once the
	// agent's first request is read, so the status answers a request
	// (written earlier it races the client's write and reads as unsolicited).
	var upErr error
	client, hello, ok := acceptTunnel(c, br)
	if !ok {
		return
	}
	ip, _ := netip.ParseAddr(connEv.IP)
	// dialUp opens a new upstream connection (TLS when isTLS); on failure
	// it answers 502 in the tunnel and logs the denial.
	dialUp := func() *upConn {
		ev := connEv
		u, status := p.dialUp(decisions, host, port, &ev)
		if u != nil && isTLS {
			var err error
			if u, err = p.upstreamTLS(u, host, port); err != nil {
				ev.Decision, ev.Reason, status = "deny", err.Error(), http.StatusBadGateway
			}
		}
		if u == nil {
			p.emit(&ev)
			writeStatus(client, status, ev.Reason)
		}
		return u
	}
	if hello {
		if p.cfg.CA == nil {
			ev := connEv
			ev.Decision, ev.Reason = "deny", errNoCA.Error()
			p.emit(&ev)
			return
		}
		tc, err := p.terminate(c, client, host)
		if err != nil {
			return // the agent does not trust the sandbox CA, or named another host
		}
		defer func() { _ = tc.Close() }()
		client, isTLS = tc, true
		switch {
		case pooled != nil:
			upc = pooled
		default:
			var err error
			if upc, err = p.upstreamTLS(newUpstream(raw, host, port, ip), host, port); err != nil {
				upc, raw = nil, nil // upstreamTLS closed it
				upErr = err
			}
		}
	} else {
		switch {
		case raw != nil:
			upc = newUpstream(raw, host, port, ip)
		default: // the pooled connection is TLS: a TCP one is needed
			if upc = dialUp(); upc == nil {
				return
			}
		}
	}
	cw := bufio.NewWriterSize(client, bufSize)
	cr := &capReader{r: client}
	cbr := bufio.NewReaderSize(cr, bufSize)
	limit := int64(connectHeaderLimit)
	for {
		req, status, msg := readRequest(client, cr, cbr, limit)
		if req == nil {
			if status != 0 {
				writeStatus(client, status, msg)
			}
			return
		}
		limit = httpHeaderLimit
		if upErr != nil {
			ev := connEv
			ev.Decision, ev.Reason = "deny", upErr.Error()
			p.emit(&ev)
			writeStatus(client, http.StatusBadGateway, ev.Reason)
			return
		}
		ev := Event{Kind: "http", Host: host, Port: port, Method: req.Method, Binary: connEv.Binary, PID: connEv.PID, Policy: connEv.Policy, IP: upc.ipText}
		if req.URL.IsAbs() || req.URL.Host != "" {
			writeStatus(client, http.StatusBadRequest, "requests inside a terminated tunnel take origin-form targets")
			return
		}
		// The upstream sees the host that was decided on.
		req.Host = authority
		if port == 443 || port == 80 {
			req.Host = hostForHeader(host)
		}
		if !p.inspect(client, req, decisions, &ev) {
			return
		}
		if !p.resolveCredentials(client, req, decisions, host, port, &ev) {
			return
		}
		if ev.Decision == "" {
			ev.Decision = "allow"
		}
		p.emit(&ev)
		next, ok, retry := forward(client, cw, req, upc, true)
		if retry {
			// A reused connection the upstream had closed: once more on
			// a new one (the request has no body and no side effects).
			if upc == pooled {
				pooled = nil
			}
			if upc.tracked == raw {
				raw = nil
			}
			p.discard(upc)
			if upc = dialUp(); upc == nil {
				return
			}
			next, ok, _ = forward(client, cw, req, upc, false)
		}
		// A clean connection has carried a whole exchange: reused from
		// now on, here or from the pool.
		upc.reused = ok
		if clean = ok; !next {
			return
		}
	}
}

// terminate takes the agent's TLS handshake on client (c is the
// connection under it, for deadlines) with a leaf of the sandbox CA for
// host, HTTP/1.1 only; the SNI must name host.
func (p *Proxy) terminate(c, client net.Conn, host string) (*tls.Conn, error) {
	tc := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}, // never h2: requests are read as HTTP/1.1
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := hi.ServerName
			if name == "" {
				name = host
			}
			if !strings.EqualFold(strings.TrimSuffix(name, "."), host) {
				return nil, fmt.Errorf("tls server name %q is not the CONNECT host %q", name, host)
			}
			return p.cfg.CA.leaf(host)
		},
	})
	_ = c.SetDeadline(time.Now().Add(headerTimeout))
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return tc, nil
}

// upstreamTLS opens TLS over the TCP connection of u to host, verified
// against Config.UpstreamRoots; on failure u is closed.
func (p *Proxy) upstreamTLS(u *upConn, host string, port uint32) (*upConn, error) {
	var roots *x509.CertPool
	if p.cfg.UpstreamRoots != nil {
		roots = p.cfg.UpstreamRoots()
	}
	utc := tls.Client(u.Conn, &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	_ = u.SetDeadline(time.Now().Add(p.cfg.DialTimeout))
	if err := utc.Handshake(); err != nil {
		p.discard(u)
		return nil, fmt.Errorf("upstream tls %s:%d: %w", host, port, err)
	}
	_ = u.SetDeadline(time.Time{})
	t := newUpstream(utc, host, port, u.ip)
	t.tracked = u.tracked
	return t, nil
}

func hostForHeader(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// prefixConn reads first what a bufio.Reader already buffered.
type prefixConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if p.r != nil {
		if p.r.Buffered() > 0 {
			return p.r.Read(b)
		}
		p.r = nil
	}
	return p.Conn.Read(b)
}

var errNoCA = errors.New("tls to a protocol rest endpoint needs the sandbox CA to be inspected, which this proxy was not given")
