package egress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestProxyHandsInferenceLocalToItsHandler: requests for inference.local
// reach Config.Inference whatever the policy (here: deny everything),
// with the caller identified, and produce no policy decision; the next
// request on the same connection for another host is decided by the
// policy again.
func TestProxyHandsInferenceLocalToItsHandler(t *testing.T) {
	var served atomic.Int32
	var caller atomic.Value
	tp := startProxy(t, Config{
		Identify: fixedCaller("/usr/bin/curl"),
		Resolver: loopbackResolver("denied.test"),
		Inference: func(c net.Conn, req *http.Request, cl Caller) bool {
			served.Add(1)
			caller.Store(cl.Exe)
			_, _ = io.Copy(io.Discard, req.Body)
			body := "routed " + req.URL.Path
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
	if served.Load() != 2 || caller.Load() != "/usr/bin/curl" {
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
