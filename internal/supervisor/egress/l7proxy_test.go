package egress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// recordingUpstream is a loopback HTTP server that records "METHOD
// path?query" of every request it receives and counts connections.
type recordingUpstream struct {
	port  uint32
	mu    sync.Mutex
	seen  []string
	conns int
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, r.Method+" "+r.URL.RequestURI())
		u.mu.Unlock()
		fmt.Fprintf(w, "ok %s %s %s", r.Method, r.URL.Path, b)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.mu.Lock()
			u.conns++
			u.mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(ps)
	u.port = uint32(n)
	return u
}

func (u *recordingUpstream) requests() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...), u.conns
}

func restRules(port uint32, mod func(*sandboxv1.NetworkEndpoint)) map[string]*sandboxv1.NetworkPolicyRule {
	ep := &sandboxv1.NetworkEndpoint{Host: "api.test", Port: port, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Enforcement: "enforce", Access: "read-only"}
	mod(ep)
	return map[string]*sandboxv1.NetworkPolicyRule{"api": {Name: "api", Endpoints: []*sandboxv1.NetworkEndpoint{ep},
		Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
}

// rawClient is one client connection to the proxy on which requests are
// written by hand, so tests control keep-alive.
type rawClient struct {
	c  net.Conn
	br *bufio.Reader
}

func dialProxy(t *testing.T, tp *testProxy) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", tp.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{c: c, br: bufio.NewReader(c)}
}

// reply is a response read off a rawClient, body already read and closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

func (rc *rawClient) do(t *testing.T, method, url, body string) (reply, string) {
	t.Helper()
	fmt.Fprintf(rc.c, "%s %s HTTP/1.1\r\nHost: ignored\r\nContent-Length: %d\r\n\r\n%s", method, url, len(body), body)
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return reply{resp.StatusCode, resp.Header}, string(b)
}

// readStatus reads one response off rc and returns its status.
func (rc *rawClient) readStatus(t *testing.T) int {
	t.Helper()
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The proxy decides every request of a kept-alive connection on its own:
// an allowed GET is forwarded and the connection stays open, the next
// request on it (a POST outside read-only) is refused with OpenShell's
// JSON 403 and never reaches the upstream.
func TestProxyL7EnforceKeepAlive(t *testing.T) {
	up := newRecordingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(up.port, func(*sandboxv1.NetworkEndpoint) {}))
	base := fmt.Sprintf("http://api.test:%d", up.port)
	rc := dialProxy(t, tp)

	resp, body := rc.do(t, "GET", base+"/repos/x?token=secret", "")
	if resp.StatusCode != 200 || body != "ok GET /repos/x " {
		t.Fatalf("GET = %d %q, want 200 from the upstream", resp.StatusCode, body)
	}
	ev := tp.events.last(t)
	if ev.Decision != "allow" || ev.Method != "GET" || ev.Path != "/repos/x" || ev.Policy != "api" || ev.IP != "127.0.0.1" {
		t.Errorf("GET event = %+v", ev)
	}
	if s := fmt.Sprintf("%+v", ev); strings.Contains(s, "secret") || strings.Contains(s, "token") {
		t.Errorf("event carries the query: %s", s)
	}
	// A second GET on the same connection reuses the upstream connection.
	if resp, _ := rc.do(t, "GET", base+"/a/../b", ""); resp.StatusCode != 200 {
		t.Fatalf("second GET = %d, want 200", resp.StatusCode)
	}

	resp, body = rc.do(t, "POST", base+"/repos/x?token=secret", "payload")
	if resp.StatusCode != 403 || resp.Header.Get("X-OpenShell-Policy") != "api" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("POST = %d %v, want OpenShell's JSON 403", resp.StatusCode, resp.Header)
	}
	var deny map[string]any
	if err := json.Unmarshal([]byte(body), &deny); err != nil {
		t.Fatalf("403 body %q: %v", body, err)
	}
	if deny["error"] != "policy_denied" || deny["detail"] != "POST /repos/x not permitted by policy" || deny["path"] != "/repos/x" ||
		deny["method"] != "POST" || deny["policy"] != "api" || deny["layer"] != "l7" || deny["protocol"] != "rest" || strings.Contains(body, "secret") {
		t.Errorf("403 body = %s", body)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || ev.Method != "POST" || ev.Path != "/repos/x" || ev.Reason != "POST /repos/x not permitted by policy" {
		t.Errorf("deny event = %+v", ev)
	}
	if _, err := rc.br.ReadByte(); err != io.EOF {
		t.Errorf("connection after an enforced denial: read err %v, want EOF (closed)", err)
	}
	seen, conns := up.requests()
	if want := []string{"GET /repos/x?token=secret", "GET /b"}; fmt.Sprint(seen) != fmt.Sprint(want) || conns != 1 {
		t.Errorf("upstream saw %q on %d connections, want %q on 1 (canonical path, POST never forwarded)", seen, conns, want)
	}
	if groups, _ := tp.proxy.Denials.Snapshot(); len(groups) != 1 || groups[0].Count != 1 {
		t.Errorf("denials = %+v, want the POST counted", groups)
	}
}

// enforcement: audit logs the violation and forwards the request.
func TestProxyL7Audit(t *testing.T) {
	up := newRecordingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(up.port, func(ep *sandboxv1.NetworkEndpoint) { ep.Enforcement = "audit" }))
	rc := dialProxy(t, tp)
	resp, body := rc.do(t, "POST", fmt.Sprintf("http://api.test:%d/x", up.port), "data")
	if resp.StatusCode != 200 || body != "ok POST /x data" {
		t.Fatalf("audited POST = %d %q, want forwarded", resp.StatusCode, body)
	}
	if ev := tp.events.last(t); ev.Decision != "audit" || ev.Reason != "POST /x not permitted by policy" || ev.Path != "/x" {
		t.Errorf("audit event = %+v", ev)
	}
	if resp, _ := rc.do(t, "GET", fmt.Sprintf("http://api.test:%d/y", up.port), ""); resp.StatusCode != 200 {
		t.Errorf("GET after an audited POST = %d, want 200 on the same connection", resp.StatusCode)
	}
	if ev := tp.events.last(t); ev.Decision != "allow" || ev.Reason != "" {
		t.Errorf("GET after audit: event %+v, want a plain allow", ev)
	}
}

func TestProxyL7RefusesWhatItCannotInspect(t *testing.T) {
	up := newRecordingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(up.port, func(*sandboxv1.NetworkEndpoint) {}))
	target := fmt.Sprintf("api.test:%d", up.port)

	// Plain HTTP inside a CONNECT tunnel is inspected as well (OpenShell
	// detects the protocol from the first bytes): GET forwarded, POST 403.
	tun := dialProxy(t, tp)
	fmt.Fprintf(tun.c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	if code := tun.readStatus(t); code != 200 {
		t.Fatalf("CONNECT = %d", code)
	}
	if resp, body := tun.do(t, "GET", "/tunneled?q=1", ""); resp.StatusCode != 200 || body != "ok GET /tunneled " {
		t.Errorf("GET in the tunnel = %d %q", resp.StatusCode, body)
	}
	if resp, body := tun.do(t, "POST", "/tunneled", "x"); resp.StatusCode != 403 || !strings.Contains(body, "policy_denied") {
		t.Errorf("POST in the tunnel = %d %q, want 403", resp.StatusCode, body)
	}
	// A path escaping the root or an encoded slash: 400, not forwarded.
	for _, p := range []string{"/../etc", "/a%2Fb"} {
		rc := dialProxy(t, tp)
		if resp, _ := rc.do(t, "GET", "http://"+target+p, ""); resp.StatusCode != 400 {
			t.Errorf("GET %s = %d, want 400", p, resp.StatusCode)
		}
	}
	// Headers beyond 16 KiB on a kept-alive connection: 431.
	rc := dialProxy(t, tp)
	if resp, _ := rc.do(t, "GET", "http://"+target+"/ok", ""); resp.StatusCode != 200 {
		t.Fatalf("GET = %d", resp.StatusCode)
	}
	fmt.Fprintf(rc.c, "GET http://%s/big HTTP/1.1\r\nX-Big: %s\r\n\r\n", target, strings.Repeat("a", 17<<10))
	if code := rc.readStatus(t); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("17 KiB header = %d, want 431", code)
	}
	// The first request of a connection may carry 8 KiB.
	rc = dialProxy(t, tp)
	fmt.Fprintf(rc.c, "GET http://%s/big HTTP/1.1\r\nX-Big: %s\r\n\r\n", target, strings.Repeat("a", 9<<10))
	if code := rc.readStatus(t); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("9 KiB first header = %d, want 431", code)
	}
	if seen, _ := up.requests(); strings.Join(seen, "|") != "GET /tunneled?q=1|GET /ok" {
		t.Errorf("upstream saw %q, want only GET /tunneled?q=1 and GET /ok", seen)
	}
}

// A request with Expect: 100-continue gets the interim 100 and then the
// final response, and the connection stays usable.
func TestProxyRelaysInterimResponses(t *testing.T) {
	up := newRecordingUpstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(up.port, func(ep *sandboxv1.NetworkEndpoint) { ep.Access = "read-write" }))
	rc := dialProxy(t, tp)
	fmt.Fprintf(rc.c, "POST http://api.test:%d/x HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", up.port)
	if code := rc.readStatus(t); code != http.StatusContinue {
		t.Fatalf("first response = %d, want 100", code)
	}
	fmt.Fprint(rc.c, "data")
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok POST /x data" {
		t.Fatalf("final response = %d %q, want 200 from the upstream", resp.StatusCode, b)
	}
	if r, _ := rc.do(t, "GET", fmt.Sprintf("http://api.test:%d/y", up.port), ""); r.StatusCode != 200 {
		t.Errorf("next request = %d, want 200", r.StatusCode)
	}
}

// BenchmarkL7Requests compares keep-alive GETs to a loopback upstream
// directly and through the proxy with REST inspection, interleaved in one
// run (issue 15 wants the proxied rate at 0.5x direct or better):
// x-direct is the proxied request rate over the direct one. relay-x-direct
// is the same for a bare TCP relay (the proxy's tunnel copy, no parsing)
// in front of the upstream: the floor of the extra hop, the rest of the
// proxy's cost being the requests and responses it parses and writes
// again, its decisions and events.
func BenchmarkL7Requests(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	b.Cleanup(srv.Close)
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(ps)
	tp := startProxy(b, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(uint32(port), func(ep *sandboxv1.NetworkEndpoint) {
			ep.DenyRules = []*sandboxv1.L7DenyRule{{Method: "GET", Path: "/admin/**"}}
		}))
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
	relay := startBareRelay(b, srv.Listener.Addr().String(), pump)
	direct := &http.Client{Transport: &http.Transport{}}
	proxied := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(tp.url)}}
	relayed := &http.Client{Transport: &http.Transport{}}
	defer direct.CloseIdleConnections()
	defer proxied.CloseIdleConnections()
	defer relayed.CloseIdleConnections()
	directURL, proxyURL := srv.URL+"/repos/x?q=1", fmt.Sprintf("http://api.test:%d/repos/x?q=1", port)
	relayURL := "http://" + relay.Addr().String() + "/repos/x?q=1"
	var td, tpx, tr time.Duration
	n := 0
	for b.Loop() {
		td += get(direct, directURL)
		tpx += get(proxied, proxyURL)
		tr += get(relayed, relayURL)
		n++
	}
	b.ReportMetric(float64(n)/td.Seconds(), "direct-req/s")
	b.ReportMetric(float64(n)/tpx.Seconds(), "proxy-req/s")
	b.ReportMetric(td.Seconds()/tpx.Seconds(), "x-direct")
	b.ReportMetric(td.Seconds()/tr.Seconds(), "relay-x-direct")
}

// A streamed response reaches the client as the upstream flushes it, not
// when it ends.
func TestProxyStreamsResponses(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first;")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "second")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(ps)
	tp := startProxy(t, Config{Resolver: loopbackResolver("api.test"), Identify: fixedCaller("/usr/bin/curl")},
		restRules(uint32(port), func(*sandboxv1.NetworkEndpoint) {}))
	rc := dialProxy(t, tp)
	fmt.Fprintf(rc.c, "GET http://api.test:%d/stream HTTP/1.1\r\n\r\n", port)
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("first;"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first;" {
		t.Fatalf("first chunk = %q, %v; want it before the upstream ends the response", first, err)
	}
	close(release)
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "second" {
		t.Errorf("rest = %q, %v", rest, err)
	}
}
