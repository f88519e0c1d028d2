package egress

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestProxyHandsPolicyLocalToItsHandler: absolute-form requests for
// policy.local on port 80 reach Config.PolicyLocal whatever the policy
// (here: deny everything), with the caller identified and no policy
// decision or denial recorded; another port, or a CONNECT tunnel, is
// OpenShell's 400 invalid_policy_local_scheme; without a handler the
// proxy answers OpenShell's 503.
func TestProxyHandsPolicyLocalToItsHandler(t *testing.T) {
	var served atomic.Int32
	var caller atomic.Value
	handler := func(c net.Conn, req *http.Request, cl Caller) {
		served.Add(1)
		caller.Store(cl.Exe)
		b, _ := io.ReadAll(req.Body)
		WriteJSON(c, http.StatusAccepted, map[string]any{"method": req.Method, "path": req.URL.Path, "body": string(b)})
	}
	tp := startProxy(t, Config{Identify: fixedCaller("/usr/bin/curl"), PolicyLocal: handler}, nil)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(tp.url)}}
	defer c.CloseIdleConnections()
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for range 2 { // the connection closes after each answer; the next one is new
		code, body := do("POST", "http://POLICY.local/v1/proposals", `{"x":1}`)
		if code != http.StatusAccepted || body != `{"body":"{\"x\":1}","method":"POST","path":"/v1/proposals"}` {
			t.Fatalf("POST http://policy.local/v1/proposals = %d %s", code, body)
		}
	}
	if served.Load() != 2 || caller.Load() != "/usr/bin/curl" {
		t.Errorf("handler served %d requests, caller %v", served.Load(), caller.Load())
	}
	const wrongScheme = `{"detail":"Use http://policy.local only","error":"invalid_policy_local_scheme"}`
	if code, body := do("GET", "http://policy.local:8080/v1/policy/current", ""); code != http.StatusBadRequest || body != wrongScheme {
		t.Errorf("policy.local:8080 = %d %s, want 400 %s", code, body, wrongScheme)
	}
	resp, err := c.Get("https://policy.local/v1/policy/current")
	if err == nil {
		resp.Body.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "Bad Request") {
		t.Errorf("https://policy.local = %v, want the CONNECT refused with 400", err)
	}
	if served.Load() != 2 {
		t.Errorf("handler served %d requests, want the refused ones not to reach it", served.Load())
	}
	tp.events.mu.Lock()
	n := len(tp.events.evs)
	tp.events.mu.Unlock()
	if groups, _ := tp.proxy.Denials.Drain(); n != 0 || len(groups) != 0 {
		t.Errorf("policy.local produced %d policy decisions and %d denial groups", n, len(groups))
	}

	bare := startProxy(t, Config{Identify: fixedCaller("/usr/bin/curl")}, nil)
	bc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(bare.url)}}
	defer bc.CloseIdleConnections()
	resp, err = bc.Get("http://policy.local/v1/policy/current")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || strings.TrimSpace(string(b)) != "policy.local is not configured" {
		t.Errorf("policy.local without a handler = %d %q, want 503", resp.StatusCode, b)
	}
}
