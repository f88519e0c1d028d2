package inference

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

// serveProxy accepts agent connections on a loopback listener and hands
// every absolute-form request to r, as the egress proxy does. It returns
// the proxy URL.
func serveProxy(t testing.TB, r *Router) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close() // idle keep-alive connections
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.URL.Hostname() != Host {
						t.Errorf("proxy got a request for %s", req.URL.Host)
						return
					}
					if !r.Serve(c, req, Caller{Binary: "/usr/bin/curl", PID: 1}) {
						return
					}
				}
			})
		}
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

func agentClient(proxy *url.URL) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableCompression: true}}
}

func bundleOf(routes ...*inferencev1.ResolvedRoute) *inferencev1.GetInferenceBundleResponse {
	return &inferencev1.GetInferenceBundleResponse{Routes: routes, Revision: "r1"}
}

// seen is what a fake upstream received.
type seen struct {
	path, auth, apiKey, model, beta string
}

func fakeUpstream(t *testing.T, reply func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, chan seen) {
	t.Helper()
	got := make(chan seen, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		m, _ := body["model"].(string)
		got <- seen{path: r.URL.RequestURI(), auth: r.Header.Get("Authorization"), apiKey: r.Header.Get("X-Api-Key"), model: m, beta: r.Header.Get("Anthropic-Beta")}
		reply(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func post(t *testing.T, c *http.Client, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://inference.local"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCredentialInjected: the agent's key never reaches the upstream; the
// route's key does, in the route's auth style, with the route's model; two
// requests share one agent connection.
func TestCredentialInjected(t *testing.T) {
	srv, got := fakeUpstream(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"ok":true}`) })
	r := New(Options{})
	r.Set(bundleOf(
		&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL + "/v1", Protocols: []string{"openai_chat_completions"}, ApiKey: "sk-real", ModelId: "gpt-real", ProviderType: "openai"},
		&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL + "/anthropic/v1", Protocols: []string{"anthropic_messages"}, ApiKey: "ak-real", ModelId: "claude-real", ProviderType: "anthropic"},
		&inferencev1.ResolvedRoute{Name: "sandbox-system", BaseUrl: srv.URL, Protocols: []string{"openai_embeddings"}, ApiKey: "sys", ProviderType: "openai"},
	))
	c := agentClient(serveProxy(t, r))
	resp := post(t, c, "/v1/chat/completions", `{"model":"whatever","messages":[]}`, map[string]string{"Authorization": "Bearer sandbox-fake"})
	if body := readAll(t, resp); resp.StatusCode != 200 || body != `{"ok":true}` {
		t.Fatalf("chat = %d %q", resp.StatusCode, body)
	}
	if s := <-got; s != (seen{path: "/v1/chat/completions", auth: "Bearer sk-real", model: "gpt-real"}) {
		t.Errorf("upstream saw %+v", s)
	}
	resp = post(t, c, "/v1/messages", `{"model":"x","max_tokens":1}`, map[string]string{"X-Api-Key": "sandbox-fake", "Anthropic-Beta": "b1"})
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("messages = %d %q", resp.StatusCode, body)
	}
	if s := <-got; s != (seen{path: "/anthropic/v1/messages", apiKey: "ak-real", model: "claude-real", beta: "b1"}) {
		t.Errorf("upstream saw %+v", s)
	}
	// The sandbox-system route does not serve inference.local.
	resp = post(t, c, "/v1/embeddings", `{"input":"x"}`, nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "no compatible inference route available") {
		t.Errorf("embeddings = %d %q", resp.StatusCode, body)
	}
}

// TestRefusals: no routes → 503 with a hint; a path no protocol matches →
// 403; both leave the connection usable.
func TestRefusals(t *testing.T) {
	r := New(Options{})
	c := agentClient(serveProxy(t, r))
	resp := post(t, c, "/v1/chat/completions", `{}`, nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"error":"cluster inference is not configured"`) || !strings.Contains(body, "openshell inference set") {
		t.Errorf("no routes = %d %q", resp.StatusCode, body)
	}
	resp = post(t, c, "/admin", `{}`, nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "connection not allowed by policy") {
		t.Errorf("unknown path = %d %q", resp.StatusCode, body)
	}
}

// TestStreamingIsIncremental: each upstream chunk reaches the agent before
// the upstream sends the next one (the upstream waits until the agent has
// read the first event).
func TestStreamingIsIncremental(t *testing.T) {
	firstRead := make(chan struct{})
	srv, _ := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-firstRead:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
			t.Error("the agent never saw the first event before the stream ended")
			return
		}
		_, _ = io.WriteString(w, "data: two\n\ndata: [DONE]\n\n")
	})
	r := New(Options{})
	r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL, Protocols: []string{"openai_chat_completions"}, ApiKey: "k", ProviderType: "openai"}))
	c := agentClient(serveProxy(t, r))
	resp := post(t, c, "/v1/chat/completions", `{"stream":true}`, nil)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(firstRead)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\ndata: [DONE]\n\n" {
		t.Errorf("rest %q, %v", rest, err)
	}
}

// TestTimeout: an upstream that does not answer within the route's
// timeout gets a 503 instead of hanging the agent.
func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv, _ := fakeUpstream(t, func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	r := New(Options{})
	r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL, Protocols: []string{"openai_chat_completions"}, ApiKey: "k", ProviderType: "openai", TimeoutSecs: 1}))
	c := agentClient(serveProxy(t, r))
	resp := post(t, c, "/v1/chat/completions", `{}`, nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "inference service unavailable") {
		t.Errorf("timed out = %d %q", resp.StatusCode, body)
	}
}

// TestRefresh: a new revision replaces the routes, an unchanged one is
// kept, a failure keeps the installed routes, NotFound empties them.
func TestRefresh(t *testing.T) {
	r := New(Options{})
	route := &inferencev1.ResolvedRoute{Name: "inference.local", Protocols: []string{"openai_chat_completions"}}
	var next *inferencev1.GetInferenceBundleResponse
	var nextErr error
	fetch := func(context.Context) (*inferencev1.GetInferenceBundleResponse, error) { return next, nextErr }
	next = &inferencev1.GetInferenceBundleResponse{Routes: []*inferencev1.ResolvedRoute{route}, Revision: "a"}
	if err := r.Refresh(t.Context(), fetch); err != nil || r.Revision() != "a" || len(r.bundle.Load().routes) != 1 {
		t.Fatalf("first refresh: %v, revision %q", err, r.Revision())
	}
	next, nextErr = nil, errors.New("gateway down")
	if err := r.Refresh(t.Context(), fetch); err == nil || r.Revision() != "a" || len(r.bundle.Load().routes) != 1 {
		t.Errorf("failed refresh: %v, revision %q", err, r.Revision())
	}
	next, nextErr = &inferencev1.GetInferenceBundleResponse{Revision: "b"}, nil
	if err := r.Refresh(t.Context(), fetch); err != nil || r.Revision() != "b" || len(r.bundle.Load().routes) != 0 {
		t.Errorf("deleted route: %v, revision %q, routes %d", err, r.Revision(), len(r.bundle.Load().routes))
	}
	r.Set(&inferencev1.GetInferenceBundleResponse{Routes: []*inferencev1.ResolvedRoute{route}, Revision: "c"})
	next, nextErr = nil, status.Error(codes.NotFound, "no route")
	if err := r.Refresh(t.Context(), fetch); err != nil || len(r.bundle.Load().routes) != 0 {
		t.Errorf("NotFound: %v, routes %d", err, len(r.bundle.Load().routes))
	}
}

// TestRedirectNotFollowed: an upstream redirect goes back to the agent;
// the router never sends the key to the redirect's target.
func TestRedirectNotFollowed(t *testing.T) {
	other, seenOther := fakeUpstream(t, func(http.ResponseWriter, *http.Request) {})
	srv, _ := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
	})
	r := New(Options{})
	r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL, Protocols: []string{"anthropic_messages"}, ApiKey: "ak-real", ProviderType: "anthropic"}))
	c := agentClient(serveProxy(t, r))
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp := post(t, c, "/v1/messages", `{}`, nil)
	readAll(t, resp)
	if resp.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("status %d, want the upstream's 307", resp.StatusCode)
	}
	select {
	case s := <-seenOther:
		t.Errorf("the redirect target saw %+v", s)
	default:
	}
}

// TestHTTP10Agent: an HTTP/1.0 agent gets a streamed answer of unknown
// length without chunked framing, ended by the connection's close.
func TestHTTP10Agent(t *testing.T) {
	srv, _ := fakeUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: two\n\n")
	})
	r := New(Options{})
	r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL, Protocols: []string{"openai_chat_completions"}, ApiKey: "k", ProviderType: "openai"}))
	proxy := serveProxy(t, r)
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST http://inference.local/v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(string(got), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200 OK") || strings.Contains(strings.ToLower(head), "chunked") || body != "data: one\n\ndata: two\n\n" {
		t.Errorf("HTTP/1.0 answer = %q", got)
	}
}

// TestRootsOnFirstRequest: the router asks for its roots at its first
// upstream request, not before, and once; an HTTPS upstream is verified
// against them: trusted it answers, with a pool that trusts nothing the
// request fails closed (503, nothing reaches the upstream).
func TestRootsOnFirstRequest(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		var reached atomic.Int32
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reached.Add(1)
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
		t.Cleanup(srv.Close)
		pool := x509.NewCertPool()
		if trusted {
			pool.AddCert(srv.Certificate())
		}
		var calls atomic.Int32
		r := New(Options{RootCAs: func() *x509.CertPool { calls.Add(1); return pool }})
		r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: srv.URL + "/v1", Protocols: []string{"openai_chat_completions"}, ApiKey: "sk", ModelId: "m", ProviderType: "openai"}))
		c := agentClient(serveProxy(t, r))
		if n := calls.Load(); n != 0 {
			t.Fatalf("roots asked for %d times before any request, want 0", n)
		}
		want := http.StatusOK
		if !trusted {
			want = http.StatusServiceUnavailable
		}
		for range 2 {
			resp := post(t, c, "/v1/chat/completions", `{"messages":[]}`, nil)
			if body := readAll(t, resp); resp.StatusCode != want {
				t.Fatalf("trusted %v: chat = %d %q, want %d", trusted, resp.StatusCode, body, want)
			}
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("trusted %v: roots asked for %d times, want 1", trusted, n)
		}
		if n, w := reached.Load(), map[bool]int32{true: 2, false: 0}[trusted]; n != w {
			t.Errorf("trusted %v: upstream reached %d times, want %d", trusted, n, w)
		}
	}
}
