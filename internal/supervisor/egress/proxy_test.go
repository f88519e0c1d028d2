package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// events collects a proxy's decisions.
type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) { e.mu.Lock(); e.evs = append(e.evs, ev); e.mu.Unlock() }
func (e *events) last(t *testing.T) Event {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.evs) == 0 {
		t.Fatal("no decision event")
	}
	return e.evs[len(e.evs)-1]
}

type testProxy struct {
	url    *url.URL
	events *events
	proxy  *Proxy
}

func loopbackDial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", a.String())
}

// startProxy serves a proxy on loopback; cfg.Dial defaults to a plain
// loopback dial and OnEvent is set.
func startProxy(t testing.TB, cfg Config, rules map[string]*sandboxv1.NetworkPolicyRule) *testProxy {
	t.Helper()
	ev := &events{}
	if cfg.Dial == nil {
		cfg.Dial = loopbackDial
	}
	cfg.OnEvent = ev.add
	s, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	p := New(cfg, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testProxy{url: &url.URL{Scheme: "http", Host: ln.Addr().String()}, events: ev, proxy: p}
}

func fixedCaller(exe string) func(client, server netip.AddrPort) ([]Caller, error) {
	return func(netip.AddrPort, netip.AddrPort) ([]Caller, error) { return []Caller{{PID: 42, Exe: exe}}, nil }
}

func upstream(t *testing.T) (port uint32) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(ps)
	return uint32(n)
}

func loopbackResolver(names ...string) StaticResolver {
	r := StaticResolver{}
	for _, n := range names {
		r[n] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	return r
}

func curlRules(port uint32, allowedIPs ...string) map[string]*sandboxv1.NetworkPolicyRule {
	return map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port, AllowedIps: allowedIPs}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}
}

func get(t *testing.T, proxy *url.URL, target string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connect sends a CONNECT and, when it is answered 200, one GET through
// the tunnel; it returns the CONNECT status and the tunnelled body.
func connect(t *testing.T, proxy *url.URL, authority string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a proxy that stopped answering fails the test
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", authority)
	r2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	b, _ := io.ReadAll(r2.Body)
	return r2.StatusCode, string(b)
}

func TestProxyAllowsAndDenies(t *testing.T) {
	port := upstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test", "other.test"), Identify: fixedCaller("/usr/bin/curl")},
		curlRules(port, "127.0.0.1"))
	target := fmt.Sprintf("allowed.test:%d", port)

	code, body := get(t, tp.url, "http://"+target+"/path?secret=1")
	if code != 200 || body != "hello "+target+" /path" {
		t.Fatalf("forward GET = %d %q, want 200 from the upstream", code, body)
	}
	ev := tp.events.last(t)
	if ev.Decision != "allow" || ev.Policy != "up" || ev.Host != "allowed.test" || ev.IP != "127.0.0.1" || ev.Port != port || ev.Binary != "/usr/bin/curl" || ev.PID != 42 || ev.Kind != "http" {
		t.Errorf("allow event = %+v", ev)
	}
	if s := fmt.Sprintf("%+v", ev); strings.Contains(s, "secret") || strings.Contains(s, "/path") {
		t.Errorf("event carries the path or query: %s", s)
	}

	// A Host header naming another host does not reach the upstream.
	raw, err := net.Dial("tcp", tp.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(raw, "GET http://%s/fronted HTTP/1.1\r\nHost: other.test\r\n\r\n", target)
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	fronted, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	raw.Close()
	if string(fronted) != "hello "+target+" /fronted" {
		t.Errorf("forward GET with another Host header reached the upstream as %q, want the decided host", fronted)
	}

	if code, body := connect(t, tp.url, target); code != 200 || body != "hello "+target+" /tunnel" {
		t.Fatalf("CONNECT = %d %q, want 200 and the tunnelled response", code, body)
	}
	if ev := tp.events.last(t); ev.Kind != "connect" || ev.Decision != "allow" {
		t.Errorf("CONNECT event = %+v", ev)
	}

	other := fmt.Sprintf("other.test:%d", port)
	if code, body := connect(t, tp.url, other); code != 403 || !strings.Contains(body, "endpoint "+other+" is not allowed by any policy") {
		t.Errorf("CONNECT to another host = %d %q, want 403 naming the endpoint", code, body)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || ev.Host != "other.test" || ev.IP != "" || ev.Finding != "" {
		t.Errorf("deny event = %+v, want no finding (a policy denial)", ev)
	}
	if code, _ := get(t, tp.url, "http://"+other+"/"); code != 403 {
		t.Errorf("forward GET to another host = %d, want 403", code)
	}
	if code, _ := connect(t, tp.url, fmt.Sprintf("allowed.test:%d", port+1)); code != 403 {
		t.Errorf("CONNECT to the allowed host on another port = %d, want 403", code)
	}
	groups, dropped := tp.proxy.Denials.Snapshot()
	if dropped != 0 || len(groups) != 2 || groups[0] != (DenialCount{DenialKey{"/usr/bin/curl", "other.test", port}, 2}) {
		t.Errorf("denials = %+v (dropped %d), want other.test counted twice first", groups, dropped)
	}
}

func TestProxySSRFGuard(t *testing.T) {
	port := upstream(t)
	target := fmt.Sprintf("allowed.test:%d", port)
	// The policy allows the host but not its (loopback) address.
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port))
	if code, body := connect(t, tp.url, target); code != 403 || !strings.Contains(body, "address 127.0.0.1 is internal") {
		t.Errorf("CONNECT to a host resolving to loopback = %d %q, want 403 (internal address)", code, body)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || ev.Finding != FindingSSRF {
		t.Errorf("internal address event = %+v, want a deny with finding %s", ev, FindingSSRF)
	}
	// Metadata names are refused before any lookup, whatever allowed_ips says.
	meta := map[string]*sandboxv1.NetworkPolicyRule{"m": {Name: "m",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "metadata.google.internal", Port: 80, AllowedIps: []string{"0.0.0.0/0"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: "/**"}}}}
	tm := startProxy(t, Config{Resolver: loopbackResolver("metadata.google.internal"), Identify: fixedCaller("/usr/bin/curl")}, meta)
	if code, body := get(t, tm.url, "http://metadata.google.internal/computeMetadata/v1/"); code != 403 || !strings.Contains(body, "cloud metadata") {
		t.Errorf("metadata = %d %q, want 403", code, body)
	}
	if ev := tm.events.last(t); ev.Decision != "deny" || ev.Finding != FindingSSRF || ev.Reason != "host metadata.google.internal is a cloud metadata service" {
		t.Errorf("metadata event = %+v, want a deny with finding %s", ev, FindingSSRF)
	}
}

// TestProxyEveryHolderDecides: when two processes hold the client socket,
// each must be allowed, and each one's matching endpoint must admit the
// resolved addresses.
func TestProxyEveryHolderDecides(t *testing.T) {
	port := upstream(t)
	rules := map[string]*sandboxv1.NetworkPolicyRule{
		"a": {Name: "a", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port, AllowedIps: []string{"127.0.0.1"}}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
		"b": {Name: "b", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/python3"}}},
	}
	holders := func(exes ...string) func(netip.AddrPort, netip.AddrPort) ([]Caller, error) {
		return func(netip.AddrPort, netip.AddrPort) ([]Caller, error) {
			var cs []Caller
			for i, e := range exes {
				cs = append(cs, Caller{PID: 100 + i, Exe: e})
			}
			return cs, nil
		}
	}
	target := fmt.Sprintf("allowed.test:%d", port)
	for _, tt := range []struct {
		exes   []string
		code   int
		reason string
	}{
		{[]string{"/usr/bin/curl"}, 200, ""},
		{[]string{"/usr/bin/curl", "/usr/bin/wget"}, 403, "binary '/usr/bin/wget' not allowed"},
		{[]string{"/usr/bin/curl", "/usr/bin/python3"}, 403, "address 127.0.0.1 is internal"},
	} {
		tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: holders(tt.exes...)}, rules)
		code, body := connect(t, tp.url, target)
		if code != tt.code || !strings.Contains(body, tt.reason) {
			t.Errorf("holders %v: %d %q, want %d with %q", tt.exes, code, body, tt.code, tt.reason)
		}
	}
}

// flakyListener fails its first Accept calls like a process out of file
// descriptors.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// TestProxySurvivesAcceptErrors: EMFILE from accept does not end the proxy.
func TestProxySurvivesAcceptErrors(t *testing.T) {
	port := upstream(t)
	s, _ := Compile(curlRules(port, "127.0.0.1"))
	p := New(Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl"), Dial: loopbackDial}, s)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &flakyListener{Listener: inner, fails: 3}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	if code, _ := connect(t, &url.URL{Host: inner.Addr().String()}, fmt.Sprintf("allowed.test:%d", port)); code != 200 {
		t.Errorf("CONNECT after accept errors = %d, want 200", code)
	}
	inner.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestProxyShutdownClosesTunnels: closing the listener ends Serve even
// while a tunnel is open and idle on both sides.
func TestProxyShutdownClosesTunnels(t *testing.T) {
	up := loopbackServer(t, func(c net.Conn) {
		// idle: never writes, never closes until the test ends
		go func() { <-t.Context().Done(); c.Close() }()
	})
	port := uint32(up.Addr().(*net.TCPAddr).Port)
	s, _ := Compile(curlRules(port, "127.0.0.1"))
	p := New(Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl"), Dial: loopbackDial}, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: x\r\n\r\n", port)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	ln.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return with an idle tunnel open")
	}
}

func TestSSRFGuardTable(t *testing.T) {
	g := ssrfGuard{own: []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32")}}
	allowed := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("127.0.0.1/32")}
	tests := []struct {
		addr string
		ok   bool
	}{
		{"93.184.216.34", true}, {"2606:2800:220:1::1", true},
		{"127.0.0.1", true}, {"127.0.0.2", false}, {"::1", false}, {"::ffff:127.0.0.2", false},
		{"169.254.169.254", false}, {"fe80::1", false}, {"fd00:ec2::254", false},
		{"10.0.0.1", false}, {"10.9.1.1", true}, {"172.16.0.1", false}, {"192.168.1.1", false}, {"100.64.0.1", false},
		{"0.0.0.0", false}, {"::", false}, {"224.0.0.1", false}, {"203.0.113.7", false},
	}
	for _, tt := range tests {
		err := g.check([]netip.Addr{netip.MustParseAddr(tt.addr)}, allowed, false)
		if (err == nil) != tt.ok {
			t.Errorf("check(%s) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
	if err := g.check([]netip.Addr{netip.MustParseAddr("93.184.216.34")}, allowed, true); err == nil {
		t.Error("a hostless endpoint let a public address outside allowed_ips through")
	}
	// One bad address among good ones denies the connection.
	if err := g.check([]netip.Addr{netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("10.0.0.1")}, nil, false); err == nil {
		t.Error("a mixed answer with a private address was allowed")
	}
}

// rebinder answers a public address first and loopback afterwards, like
// a DNS rebinding attack.
type rebinder struct {
	mu    sync.Mutex
	calls int
}

func (r *rebinder) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.calls == 1 {
		return []netip.Addr{netip.MustParseAddr("198.51.100.10")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func TestProxyPinsTheCheckedAddress(t *testing.T) {
	port := upstream(t)
	rb := &rebinder{}
	var dialed []netip.AddrPort
	var mu sync.Mutex
	dial := func(_ context.Context, a netip.AddrPort) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, a)
		mu.Unlock()
		return nil, errors.New("test network: unreachable")
	}
	tp := startProxy(t, Config{Resolver: rb, Dial: dial, Identify: fixedCaller("/usr/bin/curl")}, curlRules(port))
	if code, _ := connect(t, tp.url, fmt.Sprintf("allowed.test:%d", port)); code != http.StatusBadGateway {
		t.Errorf("CONNECT = %d, want 502 (the pinned public address is unreachable)", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if rb.calls != 1 || len(dialed) != 1 || dialed[0] != netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), uint16(port)) {
		t.Errorf("resolver calls %d, dialed %v: want one lookup and a dial of the checked address only", rb.calls, dialed)
	}
}

func TestDenialsBounded(t *testing.T) {
	d := NewDenials(2)
	d.Add("/a", "h", 1)
	d.Add("/a", "h", 1)
	d.Add("/b", "h", 1)
	d.Add("/c", "h", 1)
	g, dropped := d.Snapshot()
	if len(g) != 2 || dropped != 1 || g[0].Count != 2 {
		t.Errorf("denials = %+v dropped %d", g, dropped)
	}
}

// procCount is the number of processes a procfs at root shows:
// identification scans their descriptors, so its cost grows with it.
func procCount(root string) int {
	ents, _ := os.ReadDir(root)
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// fdCount is the number of descriptors of the processes of a procfs at
// root (those readable here).
func fdCount(root string) int {
	ents, _ := os.ReadDir(root)
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			fds, _ := os.ReadDir(filepath.Join(root, e.Name(), "fd"))
			n += len(fds)
		}
	}
	return n
}

// loopbackServer listens on a loopback port, hands every accepted
// connection to handle (on the accept goroutine) and closes the listener
// when the test ends.
func loopbackServer(t testing.TB, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	return ln
}

// A kept-alive upstream connection is reused only while the current
// policy admits the address it reaches: after a reload that drops the
// loopback allowed_ips, the next request on the same client connection is
// refused by the SSRF guard instead of riding the open connection.
func TestProxyReusedUpstreamFollowsReload(t *testing.T) {
	port := upstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	rc := dialProxy(t, tp)
	target := fmt.Sprintf("http://allowed.test:%d/x", port)
	if r, body := rc.do(t, "GET", target, ""); r.StatusCode != 200 {
		t.Fatalf("first request = %d %q, want 200", r.StatusCode, body)
	}
	tp.proxy.SetSnapshot(mustCompile(t, curlRules(port)))
	if r, body := rc.do(t, "GET", target, ""); r.StatusCode != http.StatusForbidden {
		t.Errorf("request after the reload = %d %q, want 403", r.StatusCode, body)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || !strings.Contains(ev.Reason, "127.0.0.1") {
		t.Errorf("event = %+v, want a denial naming the refused address", ev)
	}
}

// Each request of a kept-alive client connection is decided against the
// current policy: the connection keeps its last decision only for the
// snapshot that made it. After a reload that removes the rule, the next
// request to the same host and port is denied.
func TestProxyRequestsFollowReload(t *testing.T) {
	port := upstream(t)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	rc := dialProxy(t, tp)
	target := fmt.Sprintf("http://allowed.test:%d/x", port)
	for i := range 2 {
		if r, body := rc.do(t, "GET", target, ""); r.StatusCode != 200 {
			t.Fatalf("request %d = %d %q, want 200", i, r.StatusCode, body)
		}
	}
	tp.proxy.SetSnapshot(mustCompile(t, map[string]*sandboxv1.NetworkPolicyRule{"other": {Name: "other",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "other.test", Port: port}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}}}))
	if r, body := rc.do(t, "GET", target, ""); r.StatusCode != http.StatusForbidden {
		t.Errorf("request after the reload = %d %q, want 403", r.StatusCode, body)
	}
	want := fmt.Sprintf("endpoint allowed.test:%d is not allowed by any policy", port)
	if ev := tp.events.last(t); ev.Decision != "deny" || ev.Reason != want {
		t.Errorf("event = %+v, want a denial: %s", ev, want)
	}
}

// TestTunnelCopiesBetweenTCPConns: a relayed tunnel hands pump the
// accepted and dialed *net.TCPConn themselves (read into a buffer only
// while bytes are ready; a wrapper would fall back to io.Copy and its
// buffer held for the tunnel's life), with the bytes the client sent along
// with its CONNECT header (left in the request reader) forwarded first,
// and each direction's end passed on as a half-close.
func TestTunnelCopiesBetweenTCPConns(t *testing.T) {
	up := loopbackServer(t, func(c net.Conn) {
		go func() {
			defer c.Close()
			b, _ := io.ReadAll(c) // until the client's half-close reaches us
			_, _ = c.Write(append([]byte("echo:"), b...))
		}()
	})
	port := uint32(up.Addr().(*net.TCPAddr).Port)
	s, _ := Compile(curlRules(port, "127.0.0.1"))
	p := New(Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl"), Dial: loopbackDial}, s)
	types := make(chan string, 1)
	p.onTunnel = func(client, upstream net.Conn) { types <- fmt.Sprintf("%T %T", client, upstream) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	defer func() { ln.Close(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first tunnel bytes in the CONNECT's own segment.
	fmt.Fprintf(c, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: x\r\n\r\nearly,", port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	bulk := strings.Repeat("x", 1<<20)
	if _, err := io.WriteString(c, bulk); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if want := "echo:early," + bulk; string(got) != want {
		t.Errorf("tunnel returned %d bytes (%.20q...), want %d", len(got), got, len(want))
	}
	if got, want := <-types, "*net.TCPConn *net.TCPConn"; got != want {
		t.Errorf("tunnel copies between %s, want %s", got, want)
	}
}

// TestIdleTunnelHoldsNoBuffer: a relayed tunnel copies through pooled
// buffers taken only while bytes are ready. After several buffers' worth
// went both ways through them, the open tunnel, idle, holds none, and
// still carries bytes afterwards.
func TestIdleTunnelHoldsNoBuffer(t *testing.T) {
	up := loopbackServer(t, func(c net.Conn) {
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }() // echo
	})
	port := uint32(up.Addr().(*net.TCPAddr).Port)
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: fixedCaller("/usr/bin/curl")}, curlRules(port, "127.0.0.1"))
	c, err := connectVia(tp.url.Host, fmt.Sprintf("allowed.test:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg []byte) {
		t.Helper()
		werr := make(chan error, 1)
		go func() { _, err := c.Write(msg); werr <- err }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("echo returned other bytes (%d)", len(got))
		}
	}
	taken := tunnelBufsTaken.Load()
	echo(bytes.Repeat([]byte("0123456789abcdef"), 3*tunnelBufSize/16))
	if n := tunnelBufsTaken.Load() - taken; n < 6 {
		t.Errorf("the tunnel took %d copy buffers for 3 buffers' worth both ways, want at least 6", n)
	}
	for deadline := time.Now().Add(5 * time.Second); tunnelBufsOut.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("an idle tunnel holds %d copy buffers, want 0", tunnelBufsOut.Load())
		}
	}
	echo([]byte("still open"))
}
