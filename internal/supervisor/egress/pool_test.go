package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// closingUpstream answers every request with 200 "ok" and then closes the
// connection without saying so (as a server ending an idle keep-alive
// connection does); it counts the connections it accepted.
func closingUpstream(t *testing.T) (port uint32, conns *atomic.Int32) {
	t.Helper()
	conns = &atomic.Int32{}
	ln := loopbackServer(t, func(c net.Conn) {
		conns.Add(1)
		go func() {
			defer c.Close()
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}()
	})
	return uint32(ln.Addr().(*net.TCPAddr).Port), conns
}

// countingUpstream is a keep-alive HTTP server (closing after a request
// saying Connection: close) counting its connections.
func countingUpstream(t *testing.T) (port uint32, conns *atomic.Int32) {
	t.Helper()
	conns = &atomic.Int32{}
	ln := loopbackServer(t, func(c net.Conn) {
		conns.Add(1)
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if req.Close { // as real servers do
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
					return
				}
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"); err != nil {
					return
				}
			}
		}()
	})
	return uint32(ln.Addr().(*net.TCPAddr).Port), conns
}

// waitPooled waits until the proxy's pool holds n connections.
func waitPooled(t *testing.T, p *Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.pool.mu.Lock()
		got := p.pool.n
		p.pool.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d connections, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Upstream connections of forwarded http:// requests outlive their client
// connection: the next client to the same destination reuses one.
func TestProxyPoolsUpstreamConnections(t *testing.T) {
	port, conns := countingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	target := fmt.Sprintf("http://allowed.test:%d/x", port)
	for i := range 3 {
		rc := dialProxy(t, tp)
		if r, body := rc.do(t, "GET", target, ""); r.StatusCode != 200 || body != "hello" {
			t.Fatalf("client %d: %d %q", i, r.StatusCode, body)
		}
		rc.c.Close()
		waitPooled(t, tp.proxy, 1)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("upstream accepted %d connections for 3 clients, want 1 (pooled)", n)
	}
	if ev := tp.events.last(t); ev.Decision != "allow" || ev.IP != "127.0.0.1" {
		t.Errorf("event of a pooled request = %+v, want allow with the address", ev)
	}
}

// A pooled connection is taken only when the current policy admits the
// address it reaches.
func TestProxyPoolFollowsReload(t *testing.T) {
	port, _ := countingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	target := fmt.Sprintf("http://allowed.test:%d/x", port)
	rc := dialProxy(t, tp)
	if r, _ := rc.do(t, "GET", target, ""); r.StatusCode != 200 {
		t.Fatalf("first client: %d", r.StatusCode)
	}
	rc.c.Close()
	waitPooled(t, tp.proxy, 1)
	tp.proxy.SetSnapshot(mustCompile(t, curlRules(port))) // loopback no longer in allowed_ips
	rc = dialProxy(t, tp)
	if r, body := rc.do(t, "GET", target, ""); r.StatusCode != http.StatusForbidden {
		t.Errorf("after the reload: %d %q, want 403", r.StatusCode, body)
	}
	waitPooled(t, tp.proxy, 0)
}

// An upstream that closed a kept-alive connection gets a replayable
// request again on a new connection (no 502); a POST is not replayed.
func TestProxyRetriesClosedUpstream(t *testing.T) {
	port, conns := closingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	target := fmt.Sprintf("http://allowed.test:%d/x", port)
	rc := dialProxy(t, tp)
	for i := range 3 {
		if r, body := rc.do(t, "GET", target, ""); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("GET %d on one client connection: %d %q, want 200 (retried on a new upstream connection)", i, r.StatusCode, body)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("upstream accepted %d connections, want 3", n)
	}
	if r, body := rc.do(t, "POST", target, "data"); r.StatusCode != http.StatusBadGateway || !strings.Contains(body, "no valid upstream response") {
		t.Errorf("POST on a closed upstream connection: %d %q, want 502 (not replayed)", r.StatusCode, body)
	}
}

// The pool is bounded per destination and drops connections idle longer
// than idleTimeout.
func TestUpPoolBoundsAndExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	p := &upPool{now: func() time.Time { return now }}
	conn := func() *upConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return newUpstream(a, "h", 80, netip.MustParseAddr("192.0.2.1"))
	}
	kept := 0
	for range maxIdlePerDest + 2 {
		if p.put(conn()) {
			kept++
		}
	}
	if kept != maxIdlePerDest {
		t.Errorf("put kept %d connections for one destination, want %d", kept, maxIdlePerDest)
	}
	// A sweep drops what idled too long, keeps the rest.
	now = now.Add(idleTimeout / 2)
	u := p.take("h", 80, func(*upConn) bool { return true }, func(*upConn) { t.Error("a fresh connection was dropped") })
	if u == nil || !p.put(u) { // idle since now: younger than the others
		t.Fatalf("take = %v, or put refused it", u)
	}
	now = now.Add(idleTimeout/2 + time.Second)
	swept := 0
	p.sweep(func(*upConn) { swept++ })
	if swept != maxIdlePerDest-1 || p.n != 1 {
		t.Errorf("sweep dropped %d, kept %d; want %d dropped and the younger one kept", swept, p.n, maxIdlePerDest-1)
	}
	now = now.Add(idleTimeout + time.Second)
	dropped := 0
	if u := p.take("h", 80, func(*upConn) bool { return true }, func(*upConn) { dropped++ }); u != nil || dropped != 1 {
		t.Errorf("take after the idle timeout = %v, dropped %d; want nil and 1 dropped", u, dropped)
	}
}

// waitTLSPooled waits until the proxy's TLS pool holds n connections.
func waitTLSPooled(t *testing.T, p *Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.tlsPool.mu.Lock()
		got := p.tlsPool.n
		p.tlsPool.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS pool holds %d connections, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Terminated tunnels to a REST endpoint leave their upstream TLS
// connection in a pool: the next tunnel to the same host and port reuses
// it (no new TCP connection or handshake upstream), only while the
// current policy admits its address; one the upstream closed is replaced.
func TestProxyPoolsUpstreamTLS(t *testing.T) {
	u := newTLSUpstream(t)
	conns := &u.conns
	tp, ca := startTerminating(t, u.port, upstreamPool(u))
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	target := fmt.Sprintf("https://example.com:%d/repos/x", u.port)
	get := func(i int) int {
		t.Helper()
		c := httpsClient(tp, roots) // a new tunnel each time
		defer c.CloseIdleConnections()
		resp, err := c.Get(target)
		if err != nil {
			t.Fatalf("tunnel %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && string(body) != "secure GET /repos/x" {
			t.Fatalf("tunnel %d: %q", i, body)
		}
		return resp.StatusCode
	}
	for i := range 3 {
		if code := get(i); code != 200 {
			t.Fatalf("tunnel %d: %d", i, code)
		}
		waitTLSPooled(t, tp.proxy, 1)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("upstream accepted %d connections for 3 tunnels, want 1 (pooled)", n)
	}
	if ev := tp.events.last(t); ev.Kind != "http" || ev.Decision != "allow" || ev.IP != "127.0.0.1" {
		t.Errorf("event = %+v, want an allowed request with the address", ev)
	}

	// The upstream closes its connections: the pooled one is replaced.
	u.srv.CloseClientConnections()
	if code := get(3); code != 200 {
		t.Fatalf("after the upstream closed the pooled connection: %d, want 200", code)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("upstream accepted %d connections, want 2", n)
	}
	waitTLSPooled(t, tp.proxy, 1)

	// A reload that no longer admits loopback: the pooled connection is
	// not used, the CONNECT is refused.
	rules := map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{{
		Host: "example.com", Port: u.port, Protocol: "rest", Enforcement: "enforce", Access: "read-only"}},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
	tp.proxy.SetSnapshot(mustCompile(t, rules))
	if code, _ := connect(t, tp.url, fmt.Sprintf("example.com:%d", u.port)); code != http.StatusForbidden {
		t.Errorf("CONNECT after the reload = %d, want 403", code)
	}
	waitTLSPooled(t, tp.proxy, 0)
}

// BenchmarkL7NewTunnels compares HTTPS GETs made each on a new connection
// (as one curl run per request does) directly and through the proxy with
// TLS terminated and REST rules applied, interleaved in one run: the
// proxied side does the agent's handshake with a sandbox CA leaf and takes
// its upstream TLS connection from the pool. x-direct is the proxied
// request rate over the direct one.
func BenchmarkL7NewTunnels(b *testing.B) {
	u := newTLSUpstream(b)
	u.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	tp, ca := startTerminating(b, u.port, upstreamPool(u))
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	direct := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: upstreamPool(u), ServerName: "example.com"}}}
	proxied := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: http.ProxyURL(tp.url),
		TLSClientConfig: &tls.Config{RootCAs: roots}}}
	get := func(c *http.Client, url string) time.Duration {
		t0 := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(t0)
	}
	directURL := fmt.Sprintf("https://127.0.0.1:%d/repos/x", u.port)
	proxyURL := fmt.Sprintf("https://example.com:%d/repos/x", u.port)
	var td, tpx time.Duration
	n := 0
	for b.Loop() {
		td += get(direct, directURL)
		tpx += get(proxied, proxyURL)
		n++
	}
	b.ReportMetric(float64(n)/td.Seconds(), "direct-req/s")
	b.ReportMetric(float64(n)/tpx.Seconds(), "proxy-req/s")
	b.ReportMetric(td.Seconds()/tpx.Seconds(), "x-direct")
	b.ReportMetric(float64(u.conns.Load()-int32(n)), "upstream-conns-proxied")
}

// Connection: close from the client ends the client connection only: the
// upstream connection goes to the pool (the header is hop-by-hop).
func TestProxyClientCloseKeepsUpstream(t *testing.T) {
	port, conns := countingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	for i := range 2 {
		rc := dialProxy(t, tp)
		fmt.Fprintf(rc.c, "GET http://allowed.test:%d/x HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", port)
		resp, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hello" {
			t.Fatalf("client %d: %d %q", i, resp.StatusCode, body)
		}
		if _, err := rc.br.ReadByte(); err != io.EOF {
			t.Errorf("client %d: connection still open after Connection: close (%v)", i, err)
		}
		waitPooled(t, tp.proxy, 1)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("upstream accepted %d connections, want 1", n)
	}
}
