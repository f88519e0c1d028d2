package placeholder_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	"github.com/openshell-go/openshell/internal/supervisor/egress/placeholder"
)

var _ egress.Credentials = (*placeholder.Resolver)(nil)

// recorder is a loopback upstream that records what it received.
type recorder struct {
	mu   sync.Mutex
	reqs []string // "METHOD URI | Authorization | body"
	port uint32
}

func newRecorder(t testing.TB) *recorder {
	t.Helper()
	r := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.RequestURI+" | "+req.Header.Get("Authorization")+" | "+string(b))
		r.mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(ps)
	r.port = uint32(n)
	return r
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

type proxyEnv struct {
	proxy    *url.URL
	api      *recorder
	other    *recorder
	mu       sync.Mutex
	events   []egress.Event
	resolver *placeholder.Resolver
}

func (e *proxyEnv) lastEvent() egress.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.events[len(e.events)-1]
}

// startProxy serves a real egress proxy on loopback whose policy allows
// api.test (protocol rest, body rewrite) and other.test (plain, no L7),
// both loopback upstreams, with API_KEY bound to api.test only.
func startProxy(t testing.TB) *proxyEnv {
	t.Helper()
	e := &proxyEnv{api: newRecorder(t), other: newRecorder(t), resolver: &placeholder.Resolver{}}
	set, err := placeholder.NewSet([]placeholder.Credential{
		{Key: "API_KEY", Value: "the-real-key", Endpoints: []placeholder.Endpoint{{Host: "api.test", Port: e.api.port}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.resolver.Install(set)
	rules := map[string]*sandboxv1.NetworkPolicyRule{
		"api": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.test", Port: e.api.port, AllowedIps: []string{"127.0.0.1"},
			Protocol: "rest", Access: "full", Enforcement: "enforce", RequestBodyCredentialRewrite: true}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
		"other": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "other.test", Port: e.other.port, AllowedIps: []string{"127.0.0.1"}}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
	}
	snap, err := egress.Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	p := egress.New(egress.Config{
		Resolver: egress.StaticResolver{"api.test": lo, "other.test": lo},
		Dial: func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.String())
		},
		Identify: func(netip.AddrPort, netip.AddrPort) ([]egress.Caller, error) {
			return []egress.Caller{{PID: 42, Exe: "/usr/bin/curl"}}, nil
		},
		OnEvent: func(ev egress.Event) {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		},
		Credentials: e.resolver,
	}, snap)
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
	e.proxy = &url.URL{Scheme: "http", Host: ln.Addr().String()}
	return e
}

func (e *proxyEnv) client() *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(e.proxy)}}
}

func do(t testing.TB, c *http.Client, method, target, auth, ctype, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProxyResolves: through a real egress proxy (plain HTTP forwarding),
// placeholders in a header, the path, the query and an opted-in JSON body
// reach the bound upstream as the value; the same placeholder to another
// allowed host is 403 credential_endpoint_mismatch and an unknown one 500,
// neither forwarded, and no decision event carries a placeholder, key or
// value.
func TestProxyResolves(t *testing.T) {
	e := startProxy(t)
	c := e.client()
	defer c.CloseIdleConnections()
	ph := placeholder.For("API_KEY")
	api := "http://api.test:" + strconv.Itoa(int(e.api.port))

	st, _ := do(t, c, "POST", api+"/bot"+ph+"/send?key="+ph, "Bearer "+ph, "application/json", `{"k":"`+ph+`"}`)
	got := e.api.take()
	want := []string{"POST /botthe-real-key/send?key=the-real-key | Bearer the-real-key | {\"k\":\"the-real-key\"}"}
	if st != 200 || !slices.Equal(got, want) {
		t.Errorf("POST = %d, upstream received %q, want %q", st, got, want)
	}
	if ev := e.lastEvent(); ev.Decision != "allow" || strings.Contains(ev.Path, ph) {
		t.Errorf("allow event = %+v, want an allow without the placeholder", ev)
	}

	other := "http://other.test:" + strconv.Itoa(int(e.other.port))
	st, body := do(t, c, "GET", other+"/x", "Bearer "+ph, "", "")
	if st != 403 || !strings.Contains(body, `"error":"credential_endpoint_mismatch"`) || len(e.other.take()) != 0 {
		t.Errorf("placeholder to another host = %d %s, want 403 credential_endpoint_mismatch, not forwarded", st, body)
	}
	ev := e.lastEvent()
	if ev.Decision != "deny" || !strings.Contains(ev.Reason, "credential_endpoint_mismatch") || ev.Host != "other.test" || ev.Finding != egress.FindingCredentialMismatch {
		t.Errorf("mismatch event = %+v", ev)
	}

	st, body = do(t, c, "GET", api+"/x", "Bearer "+placeholder.For("NOPE"), "", "")
	if st != 500 || !strings.Contains(body, `"error":"credential_injection_failed"`) || len(e.api.take()) != 0 {
		t.Errorf("unknown placeholder = %d %s, want 500 credential_injection_failed, not forwarded", st, body)
	}

	st, _ = do(t, c, "GET", other+"/plain", "Bearer plain", "", "")
	if st != 200 || len(e.other.take()) != 1 {
		t.Errorf("a request without placeholders to the other host = %d", st)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.events {
		if s := fmt.Sprintf("%+v", ev); strings.Contains(s, placeholder.Prefix) || strings.Contains(s, "API_KEY") || strings.Contains(s, "the-real-key") || strings.Contains(s, "NOPE") {
			t.Errorf("event carries a placeholder, key or value: %s", s)
		}
	}
}

// BenchmarkProxy measures one request through the real proxy (plain
// HTTP, keep-alive, loopback upstream) without and with a placeholder in
// the Authorization header, in the same run, and reports the p50 of each
// (p50-ns) besides the mean.
func BenchmarkProxy(b *testing.B) {
	e := startProxy(b)
	api := "http://api.test:" + strconv.Itoa(int(e.api.port)) + "/v1/models"
	for _, tc := range []struct{ name, auth string }{
		{"plain", "Bearer not-a-placeholder-of-equal-length"},
		{"placeholder", "Bearer " + placeholder.For("API_KEY")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := e.client()
			defer c.CloseIdleConnections()
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				if st, _ := do(b, c, "GET", api, tc.auth, "", ""); st != 200 {
					b.Fatalf("status %d", st)
				}
				lat = append(lat, time.Since(start))
				e.api.take()
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		})
	}
}

// BenchmarkResolve measures Resolve alone on a request with one
// placeholder in a header and none.
func BenchmarkResolve(b *testing.B) {
	set, _ := placeholder.NewSet([]placeholder.Credential{{Key: "API_KEY", Value: "the-real-key", Endpoints: []placeholder.Endpoint{{Host: "api.test", Port: 443}}}})
	var r placeholder.Resolver
	r.Install(set)
	for _, tc := range []struct{ name, auth string }{{"none", "Bearer plain"}, {"header", "Bearer " + placeholder.For("API_KEY")}} {
		b.Run(tc.name, func(b *testing.B) {
			req, _ := http.NewRequest("GET", "http://api.test/v1/models?x=1", nil)
			req.Header.Set("User-Agent", "curl/8")
			req.Header.Set("Accept", "*/*")
			for b.Loop() {
				req.Header.Set("Authorization", tc.auth)
				if st, _, _ := r.Resolve(req, "api.test", 443); st != 0 {
					b.Fatal(st)
				}
			}
		})
	}
}
