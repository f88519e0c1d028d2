package server

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
)

// echoRouter answers service hosts ending in ".svc.test" with the
// principal's subject.
type echoRouter struct{}

func (echoRouter) IsServiceHost(host string) bool {
	return strings.HasSuffix(strings.Split(host, ":")[0], ".svc.test")
}

func (echoRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	_, _ = io.WriteString(w, "app for "+p.Subject)
}

func get(t *testing.T, c *http.Client, url, host string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServiceHostsMTLS: on a gateway requiring client certificates with
// the loopback service path on, plaintext reaches service hosts only
// (gateway routes 404, plaintext gRPC refused), cross-origin browser
// requests are refused, and TLS requests carry the certificate's user.
func TestServiceHostsMTLS(t *testing.T) {
	f := newFixture(t)
	opts := f.fullOptions(t, false)
	opts.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
	opts.Services = echoRouter{}
	opts.LoopbackServiceHTTP = true
	_, addr := startServer(t, opts)
	plain := &http.Client{}
	base := "http://" + addr + "/"

	if code, body := get(t, plain, base, "sb--web.svc.test", nil); code != http.StatusOK || body != "app for "+auth.LocalDevSubject {
		t.Errorf("plaintext service host = %d %q, want 200 from the app as the local user", code, body)
	}
	for _, path := range []string{"healthz", "readyz", "metrics", ".well-known/jwks.json", ".well-known/openid-configuration"} {
		if code, _ := get(t, plain, base+path, addr, nil); code != http.StatusNotFound {
			t.Errorf("plaintext /%s = %d, want 404", path, code)
		}
	}
	cc := dial(t, addr, nil)
	if _, err := openshellv1.NewOpenShellClient(cc).Health(t.Context(), &openshellv1.HealthRequest{}); err == nil {
		t.Error("plaintext gRPC Health succeeded, want the connection refused")
	}
	for name, hdr := range map[string]map[string]string{
		"fetch cross-site":   {"Sec-Fetch-Site": "cross-site"},
		"fetch same-site":    {"Sec-Fetch-Site": "same-site"},
		"sibling origin":     {"Origin": "http://sb--other.svc.test"},
		"null origin":        {"Origin": "null"},
		"foreign referer":    {"Referer": "http://evil.example/page"},
		"https same host":    {"Origin": "https://sb--web.svc.test"},
		"referer other port": {"Referer": "http://sb--web.svc.test:1/x"},
	} {
		if code, _ := get(t, plain, base, "sb--web.svc.test", hdr); code != http.StatusForbidden {
			t.Errorf("%s: plaintext service request = %d, want 403", name, code)
		}
	}
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://sb--web.svc.test", "Referer": "http://sb--web.svc.test/page"}
	if code, _ := get(t, plain, base, "sb--web.svc.test", same); code != http.StatusOK {
		t.Errorf("same-origin plaintext request = %d, want 200", code)
	}

	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS(f.userCert)}}
	if code, body := get(t, withCert, "https://"+addr+"/", "sb--web.svc.test", nil); code != http.StatusOK || body != "app for alice" {
		t.Errorf("TLS service host = %d %q, want 200 as alice", code, body)
	}
	if code, _ := get(t, withCert, "https://"+addr+"/healthz", addr, nil); code != http.StatusOK {
		t.Errorf("TLS /healthz = %d, want 200", code)
	}
}

// TestServiceHostsUnauthenticated: without credentials a browser gets 401,
// never the app; with the loopback path off, plaintext service hosts 404.
func TestServiceHostsUnauthenticated(t *testing.T) {
	f := newFixture(t)
	opts := f.fullOptions(t, false)
	opts.Services = echoRouter{}
	_, addr := startServer(t, opts)
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS()}}
	if code, body := get(t, noCert, "https://"+addr+"/", "sb--web.svc.test", nil); code != http.StatusUnauthorized || strings.Contains(body, "app") {
		t.Errorf("TLS without credentials = %d %q, want 401 without the app", code, body)
	}
	if code, body := get(t, &http.Client{}, "http://"+addr+"/", "sb--web.svc.test", nil); code != http.StatusNotFound || strings.Contains(body, "app") {
		t.Errorf("plaintext with the loopback path off = %d %q, want 404", code, body)
	}
	if code, _ := get(t, noCert, "https://"+addr+"/healthz", addr, nil); code != http.StatusOK {
		t.Errorf("TLS /healthz = %d, want 200", code)
	}
}
