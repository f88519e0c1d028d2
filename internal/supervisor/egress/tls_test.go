package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// tlsUpstream is a loopback HTTPS server (certificate for example.com and
// 127.0.0.1) recording "METHOD path" of every request.
type tlsUpstream struct {
	srv   *httptest.Server
	port  uint32
	conns atomic.Int32 // connections accepted
	mu    sync.Mutex
	seen  []string
}

func newTLSUpstream(t testing.TB) *tlsUpstream {
	t.Helper()
	u := &tlsUpstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Method+" "+r.URL.RequestURI()+" host="+r.Host+" proto="+r.Proto)
		u.mu.Unlock()
		fmt.Fprintf(w, "secure %s %s", r.Method, r.URL.Path)
	}))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	_, ps, _ := net.SplitHostPort(u.srv.Listener.Addr().String())
	n, _ := strconv.Atoi(ps)
	u.port = uint32(n)
	return u
}

func (u *tlsUpstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// startTerminating serves a proxy with a sandbox CA for a tls: terminate
// (the deprecated spelling, as OpenShell's examples have it) read-only REST
// endpoint example.com:port; upstreamRoots verifies the
// upstream (nil: the system roots).
func startTerminating(t testing.TB, port uint32, upstreamRoots *x509.CertPool) (*testProxy, *CA) {
	t.Helper()
	ca, err := NewCA("test sandbox")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{{
		Host: "example.com", Port: port, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Tls: "terminate", Enforcement: "enforce", Access: "read-only"}},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
	tp := startProxy(t, Config{Resolver: loopbackResolver("example.com"), Identify: fixedCaller("/usr/bin/curl"), CA: ca, UpstreamRoots: fixedRoots(upstreamRoots)}, rules)
	return tp, ca
}

func httpsClient(tp *testProxy, roots *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(tp.url), ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}}}}
}

func upstreamPool(u *tlsUpstream) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(u.srv.Certificate())
	return pool
}

// fixedRoots is a Config.UpstreamRoots of pool.
func fixedRoots(pool *x509.CertPool) func() *x509.CertPool {
	return func() *x509.CertPool { return pool }
}

// TestProxyTerminatesTLS: a client trusting the sandbox CA reaches the
// HTTPS upstream through CONNECT; each inner request is decided by the
// REST rules (GET allowed and seen upstream, POST refused with 403 and
// never forwarded), HTTP/2 is not offered, events carry method and path
// only.
func TestProxyTerminatesTLS(t *testing.T) {
	u := newTLSUpstream(t)
	tp, ca := startTerminating(t, u.port, upstreamPool(u))
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	c := httpsClient(tp, roots)
	defer c.CloseIdleConnections()
	target := fmt.Sprintf("https://example.com:%d/repos/x?token=secret", u.port)

	resp, err := c.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "secure GET /repos/x" || resp.Proto != "HTTP/1.1" {
		t.Fatalf("GET: %d %s %q", resp.StatusCode, resp.Proto, body)
	}
	if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "test sandbox" {
		t.Fatalf("GET was not served under the sandbox CA: %+v", resp.TLS)
	}
	if ev := tp.events.last(t); ev.Kind != "http" || ev.Decision != "allow" || ev.Method != "GET" || ev.Path != "/repos/x" || ev.Host != "example.com" || ev.Binary != "/usr/bin/curl" {
		t.Fatalf("GET event: %+v", ev)
	}

	resp, err = c.Post(target, "text/plain", strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"policy_denied"`) {
		t.Fatalf("POST: %d %q", resp.StatusCode, body)
	}
	ev := tp.events.last(t)
	if ev.Kind != "http" || ev.Decision != "deny" || ev.Method != "POST" || ev.Path != "/repos/x" {
		t.Fatalf("POST event: %+v", ev)
	}
	tp.events.mu.Lock()
	for _, e := range tp.events.evs {
		if strings.Contains(fmt.Sprint(e), "secret") {
			t.Errorf("event carries the query: %+v", e)
		}
	}
	tp.events.mu.Unlock()
	want := []string{fmt.Sprintf("GET /repos/x?token=secret host=example.com:%d proto=HTTP/1.1", u.port)}
	if got := u.requests(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
}

// TestProxyUpstreamRootsAtHandshake: the proxy asks for its upstream
// roots at a terminated tunnel's upstream handshake, not when it starts
// (the supervisor parses them on that first call).
func TestProxyUpstreamRootsAtHandshake(t *testing.T) {
	u := newTLSUpstream(t)
	ca, err := NewCA("test sandbox")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{{
		Host: "example.com", Port: u.port, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Enforcement: "enforce", Access: "read-only"}},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
	var calls atomic.Int32
	pool := upstreamPool(u)
	tp := startProxy(t, Config{Resolver: loopbackResolver("example.com"), Identify: fixedCaller("/usr/bin/curl"), CA: ca,
		UpstreamRoots: func() *x509.CertPool { calls.Add(1); return pool }}, rules)
	if n := calls.Load(); n != 0 {
		t.Fatalf("roots asked for %d times at start, want 0", n)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	c := httpsClient(tp, roots)
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("https://example.com:%d/x", u.port))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || calls.Load() == 0 {
		t.Fatalf("GET = %d with roots asked for %d times, want 200 after asking", resp.StatusCode, calls.Load())
	}
}

// TestProxyTerminateNeedsTrust: a client that does not trust the sandbox
// CA fails its handshake and nothing reaches the upstream (no bypass).
func TestProxyTerminateNeedsTrust(t *testing.T) {
	u := newTLSUpstream(t)
	tp, _ := startTerminating(t, u.port, upstreamPool(u))
	c := httpsClient(tp, upstreamPool(u)) // trusts the real upstream, not the sandbox CA
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("https://example.com:%d/repos/x", u.port))
	if err == nil {
		resp.Body.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("GET without trusting the sandbox CA: %v, want an unknown authority error", err)
	}
	if got := u.requests(); len(got) != 0 {
		t.Fatalf("upstream saw %q", got)
	}
}

// TestProxyTerminateVerifiesUpstream: an upstream whose certificate the
// proxy does not trust is refused with 502, nothing is forwarded.
func TestProxyTerminateVerifiesUpstream(t *testing.T) {
	u := newTLSUpstream(t)
	tp, ca := startTerminating(t, u.port, x509.NewCertPool()) // trusts nothing
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	c := httpsClient(tp, roots)
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("https://example.com:%d/repos/x", u.port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "upstream tls") {
		t.Fatalf("GET: %d %q, want 502", resp.StatusCode, body)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || !strings.Contains(ev.Reason, "certificate") {
		t.Fatalf("event: %+v", ev)
	}
	if got := u.requests(); len(got) != 0 {
		t.Fatalf("upstream saw %q", got)
	}
}

// TestProxyRestDetectsTLS: as in OpenShell, TLS to a rest endpoint is
// detected and terminated whatever its tls field says (terminate and
// passthrough change nothing); without a sandbox CA nothing is forwarded.
func TestProxyRestDetectsTLS(t *testing.T) {
	u := newTLSUpstream(t)
	ca, err := NewCA("test sandbox")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	for _, tc := range []struct {
		tls  string
		ca   *CA
		want int
	}{{"", ca, 200}, {"passthrough", ca, 200}, {"", nil, 0}} {
		rules := map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{{
			Host: "example.com", Port: u.port, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Tls: tc.tls, Enforcement: "enforce", Access: "read-only"}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
		tp := startProxy(t, Config{Resolver: loopbackResolver("example.com"), Identify: fixedCaller("/usr/bin/curl"), CA: tc.ca, UpstreamRoots: fixedRoots(upstreamPool(u))}, rules)
		c := httpsClient(tp, roots)
		resp, err := c.Get(fmt.Sprintf("https://example.com:%d/x", u.port))
		got := 0
		if err == nil {
			got = resp.StatusCode
			resp.Body.Close()
		}
		c.CloseIdleConnections()
		if got != tc.want {
			t.Errorf("tls %q, CA %v: GET = %d (%v), want %d", tc.tls, tc.ca != nil, got, err, tc.want)
		}
	}
	if got := u.requests(); len(got) != 2 {
		t.Errorf("upstream saw %q, want the two terminated GETs", got)
	}
}

func TestCALeafCache(t *testing.T) {
	ca, err := NewCA("c")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ca.leaf("Example.com.")
	b, _ := ca.leaf("example.com")
	if a != b {
		t.Fatal("leaf not cached per host")
	}
	leaf, err := x509.ParseCertificate(a.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: pool}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(ca.CertPEM()), "PRIVATE") {
		t.Fatal("CertPEM carries a key")
	}
}

// tls: skip (OpenShell's semantics): the policy compiles without error
// (a note says what it means), CONNECT tunnels to the endpoint are relayed
// as they are, the client's TLS reaching the upstream itself and requests
// the REST rules would refuse passing, plain HTTP inside such a tunnel
// too; plain http:// requests to it are still decided by the REST rules.
func TestProxyTLSSkip(t *testing.T) {
	u := newTLSUpstream(t)
	plain := upstream(t)
	ca, err := NewCA("test sandbox")
	if err != nil {
		t.Fatal(err)
	}
	ep := func(port uint32) *sandboxv1.NetworkEndpoint {
		return &sandboxv1.NetworkEndpoint{Host: "example.com", Port: port, AllowedIps: []string{"127.0.0.1"},
			Protocol: "rest", Tls: "skip", Enforcement: "enforce", Access: "read-only"}
	}
	rules := map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{ep(u.port), ep(plain)},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
	snap, err := Compile(rules)
	if err != nil {
		t.Fatalf("Compile: %v, want tls skip accepted", err)
	}
	if n := snap.Notes(); len(n) != 2 || !strings.Contains(n[0], "REST rules apply to plain http:// requests only") {
		t.Errorf("Notes() = %q, want one per tls skip REST endpoint", n)
	}
	tp := startProxy(t, Config{Resolver: loopbackResolver("example.com"), Identify: fixedCaller("/usr/bin/curl"), CA: ca, UpstreamRoots: fixedRoots(upstreamPool(u))}, rules)

	// HTTPS: the client sees the upstream's own certificate and its POST
	// (refused by read-only if inspected) reaches the upstream.
	c := httpsClient(tp, upstreamPool(u))
	defer c.CloseIdleConnections()
	resp, err := c.Post(fmt.Sprintf("https://example.com:%d/x", u.port), "text/plain", strings.NewReader("data"))
	if err != nil {
		t.Fatalf("POST through a tls skip tunnel: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "secure POST /x" || resp.TLS.PeerCertificates[0].Issuer.CommonName == "test sandbox" {
		t.Errorf("POST through a tls skip tunnel = %d %q (issuer %q), want the upstream's answer under its own certificate",
			resp.StatusCode, body, resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	if ev := tp.events.last(t); ev.Kind != "connect" || ev.Decision != "allow" || !strings.Contains(ev.Reason, "tls skip") {
		t.Errorf("event = %+v, want an allowed connect saying the tunnel is not inspected", ev)
	}

	// Plain HTTP inside a tls skip tunnel is not parsed either.
	if code, body := connectPost(t, tp.url, fmt.Sprintf("example.com:%d", plain)); code != 200 || !strings.Contains(body, "hello") {
		t.Errorf("POST inside a plain tls skip tunnel = %d %q, want the upstream's answer", code, body)
	}

	// Plain http:// requests are still inspected.
	rc := dialProxy(t, tp)
	if r, _ := rc.do(t, "POST", fmt.Sprintf("http://example.com:%d/x", plain), "data"); r.StatusCode != http.StatusForbidden {
		t.Errorf("plain http:// POST = %d, want 403 from the REST rules", r.StatusCode)
	}
}

// connectPost opens a CONNECT tunnel and sends one plain POST through it;
// it returns the POST's status and body.
func connectPost(t *testing.T, proxy *url.URL, authority string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, ""
	}
	fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndata", authority)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
