package egress

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestProxyHandsInferenceLocalToItsHandler: requests for inference.local
// (plain, and in a CONNECT tunnel whose TLS the proxy terminates) reach
// Config.Inference whatever the policy (here: deny everything), with the
// caller identified, and produce no policy decision; the next
// request on the same connection for another host is decided by the
// policy again.
func TestProxyHandsInferenceLocalToItsHandler(t *testing.T) {
	var served atomic.Int32
	var caller atomic.Value
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	tp := startProxy(t, Config{
		CA:       ca,
		Identify: fixedCaller("/usr/bin/curl"),
		Resolver: loopbackResolver("denied.test"),
		Inference: func(c net.Conn, req *http.Request, cl Caller) bool {
			served.Add(1)
			caller.Store(cl.Exe)
			_, _ = io.Copy(io.Discard, req.Body)
			body := "routed " + req.URL.Path
			if _, ok := c.(*tls.Conn); ok {
				body += " over tls"
			}
			_, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return err == nil
		},
	}, nil)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(tp.url), MaxConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	for range 2 {
		resp, err := c.Post("http://INFERENCE.local/v1/chat/completions", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "routed /v1/chat/completions" {
			t.Fatalf("inference.local = %d %q", resp.StatusCode, b)
		}
	}
	// https://inference.local: a CONNECT tunnel whose TLS the proxy
	// terminates with a leaf of its CA.
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	tc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(tp.url), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer tc.CloseIdleConnections()
	for range 2 {
		resp, err := tc.Get("https://inference.local/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "routed /v1/models over tls" {
			t.Fatalf("https://inference.local = %d %q", resp.StatusCode, b)
		}
	}
	if served.Load() != 4 || caller.Load() != "/usr/bin/curl" {
		t.Errorf("handler served %d requests, caller %v", served.Load(), caller.Load())
	}
	tp.events.mu.Lock()
	n := len(tp.events.evs)
	tp.events.mu.Unlock()
	if n != 0 {
		t.Errorf("inference.local produced %d policy decisions", n)
	}
	resp, err := c.Get("http://denied.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || tp.events.last(t).Decision != "deny" {
		t.Errorf("other host after inference.local = %d, decision %q", resp.StatusCode, tp.events.last(t).Decision)
	}
}
