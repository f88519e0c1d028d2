package gatewaytest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// serviceClient sends every request to the gateway's address whatever the
// URL's host (service hosts are *.openshell.localhost).
func (g *Gateway) serviceClient(tlsConf *tls.Config) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, g.Addr)
		},
		TLSClientConfig:   tlsConf,
		ForceAttemptHTTP2: tlsConf != nil,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// reply is what fetch read.
type reply struct {
	StatusCode int
	ProtoMajor int
	Proto      string
}

func fetch(t *testing.T, c *http.Client, url string, hdr map[string]string) (*reply, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return &reply{StatusCode: resp.StatusCode, ProtoMajor: resp.ProtoMajor, Proto: resp.Proto}, string(b), err
}

// exposeWebApp starts a sandbox running the helper's web app, exposes it as
// service "app" and returns the sandbox and the service URL.
func exposeWebApp(ctx context.Context, t *testing.T, g *Gateway, name string) (*openshellv1.Sandbox, string) {
	t.Helper()
	c := g.Client()
	port := freePort(t)
	sb := readySandbox(ctx, t, c, name, HelperCommand("http", strconv.Itoa(port))...)
	g.InstallHelper(t, sb.GetMetadata().GetId())
	resp, err := c.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: name, Service: "app", TargetPort: uint32(port)})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("http://%s--app.openshell.localhost:%d/", name, g.Port)
	if resp.GetUrl() != want {
		t.Fatalf("ExposeService URL = %q, want %q", resp.GetUrl(), want)
	}
	// The app starts with the sandbox's main process: poll until it answers.
	cl := g.serviceClient(nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, _, err := fetch(t, cl, resp.GetUrl(), nil)
		if err == nil && r.StatusCode == http.StatusOK {
			return sb, resp.GetUrl()
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s never answered 200: %v %v", resp.GetUrl(), r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServiceRouting drives a sandbox's web app through the gateway's one
// port: loopback plaintext and TLS (HTTP/2, wildcard certificate), header
// hygiene, streaming, WebSocket echo, the plaintext path's refusals, and
// removal with DeleteService and with the sandbox.
func TestServiceRouting(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, url := exposeWebApp(ctx, t, g, "web")
	plain := g.serviceClient(nil)
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")

	t.Run("plaintext page", func(t *testing.T) {
		resp, body, err := fetch(t, plain, url, map[string]string{"Sec-Fetch-Site": "none"})
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(body, `<h1 id="title">sandbox app</h1>`) {
			t.Fatalf("GET %s = %v %q %v, want the app's page", url, resp, body, err)
		}
	})
	t.Run("gateway credentials stripped", func(t *testing.T) {
		_, body, err := fetch(t, plain, url+"headers", map[string]string{"Authorization": "Basic dXNlcjpzZWNyZXQ="})
		if err != nil || !strings.Contains(body, "authorization=false") || !strings.Contains(body, "host=127.0.0.1:") {
			t.Fatalf("GET /headers = %q %v, want no Authorization and a loopback Host", body, err)
		}
	})
	t.Run("tls http2 with client certificate", func(t *testing.T) {
		tc := g.clientTLS()
		tc.ServerName = strings.Split(host, ":")[0] // checked against *.openshell.localhost
		resp, body, err := fetch(t, g.serviceClient(tc), "https://"+host+"/", nil)
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Fatalf("GET https://%s/ = %v %q %v", host, resp, body, err)
		}
		if resp.ProtoMajor != 2 {
			t.Errorf("TLS service request used %s, want HTTP/2", resp.Proto)
		}
	})
	t.Run("tls without client certificate", func(t *testing.T) {
		tc := g.clientTLS()
		tc.Certificates = nil
		tc.ServerName = strings.Split(host, ":")[0]
		resp, body, err := fetch(t, g.serviceClient(tc), "https://"+host+"/", nil)
		if err == nil {
			t.Fatalf("GET without a client certificate = %d %q, want the handshake refused", resp.StatusCode, body)
		}
	})
	t.Run("streaming", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"stream", nil)
		start := time.Now()
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		first := time.Since(start)
		if err != nil || line != "chunk 0\n" {
			t.Fatalf("first chunk = %q %v", line, err)
		}
		rest, _ := io.ReadAll(resp.Body)
		total := time.Since(start)
		if !strings.HasSuffix(string(rest), "chunk 4\n") || total-first < 300*time.Millisecond {
			t.Errorf("stream: first chunk after %v, end after %v (%q); want chunks as they are written", first, total, rest)
		}
	})
	t.Run("websocket echo", func(t *testing.T) {
		wsEchoRoundTrip(t, g.Addr, host)
	})
	t.Run("plaintext refuses gateway routes", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz", "/metrics", "/.well-known/jwks.json"} {
			resp, _, err := fetch(t, plain, "http://"+g.Addr+p, nil)
			if err != nil || resp.StatusCode != http.StatusNotFound {
				t.Errorf("plaintext GET %s = %v %v, want 404", p, resp, err)
			}
		}
	})
	t.Run("cross origin refused", func(t *testing.T) {
		for name, hdr := range map[string]map[string]string{
			"cross-site":      {"Sec-Fetch-Site": "cross-site"},
			"sibling service": {"Sec-Fetch-Site": "same-site", "Origin": "http://web--other.openshell.localhost:" + strconv.Itoa(g.Port)},
			"foreign referer": {"Referer": "http://evil.example/"},
		} {
			resp, body, err := fetch(t, plain, url, hdr)
			if err != nil || resp.StatusCode != http.StatusForbidden || strings.Contains(body, "sandbox app") {
				t.Errorf("%s: GET = %v %q %v, want 403", name, resp, body, err)
			}
		}
	})
	t.Run("unknown service", func(t *testing.T) {
		resp, _, err := fetch(t, plain, strings.Replace(url, "--app.", "--nope.", 1), nil)
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET unknown service = %v %v, want 404", resp, err)
		}
	})
	t.Run("headless chromium", func(t *testing.T) {
		chromiumDOM(t, url)
	})
	t.Run("cli", func(t *testing.T) {
		cl := newCLI(t, g)
		out := cl.ok("service", "expose", "web", "9999", "extra")
		if !strings.Contains(out, "URL: http://web--extra.openshell.localhost:"+strconv.Itoa(g.Port)+"/") {
			t.Errorf("service expose printed %q, want the URL", out)
		}
		list := cl.ok("service", "list", "web")
		for _, want := range []string{"SANDBOX", "web", "app", "extra", "9999", url} {
			if !strings.Contains(list, want) {
				t.Errorf("service list = %q, want %q in it", list, want)
			}
		}
		if get := cl.ok("service", "get", "web", "app"); !strings.Contains(get, url) {
			t.Errorf("service get = %q, want %s", get, url)
		}
		cl.ok("service", "delete", "web", "extra")
		if _, stderr, code := cl.run("", "service", "get", "web", "extra"); code == 0 || !strings.Contains(stderr, "not found") {
			t.Errorf("service get after delete = exit %d %q, want not found", code, stderr)
		}
		if _, _, code := cl.run("", "service", "expose", "web", "0"); code != 2 {
			t.Errorf("service expose with port 0 = exit %d, want usage error 2", code)
		}
	})
	t.Run("cli forward service", func(t *testing.T) {
		cl := newCLI(t, g)
		ep, err := c.GetService(ctx, &openshellv1.GetServiceRequest{Sandbox: "web", Service: "app"})
		if err != nil {
			t.Fatal(err)
		}
		cmd := cl.cmd("forward", "service", "web", "--target-port", strconv.Itoa(int(ep.GetEndpoint().GetTargetPort())))
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		line, err := bufio.NewReader(stderr).ReadString('\n') // "Forwarding 127.0.0.1:N -> ..."
		if err != nil || !strings.HasPrefix(line, "Forwarding 127.0.0.1:") {
			t.Fatalf("forward service printed %q, %v", line, err)
		}
		addr := strings.Fields(line)[1]
		resp, body, err := fetch(t, &http.Client{Timeout: 20 * time.Second}, "http://"+addr+"/", nil)
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(body, "sandbox app") {
			t.Errorf("GET through forward service %s = %v %q %v", addr, resp, body, err)
		}
		if _, _, code := cl.run("", "forward", "service", "web", "--target-port", "80", "--local", "0.0.0.0:0"); code != 2 {
			t.Errorf("forward service --local 0.0.0.0:0 = exit %d, want usage error 2", code)
		}
	})
	t.Run("deleted service", func(t *testing.T) {
		del, err := c.DeleteService(ctx, &openshellv1.DeleteServiceRequest{Sandbox: "web", Service: "app"})
		if err != nil || !del.GetDeleted() {
			t.Fatalf("DeleteService = %v, %v", del, err)
		}
		plain.CloseIdleConnections()
		resp, body, err := fetch(t, plain, url, nil)
		if err != nil || resp.StatusCode != http.StatusNotFound || strings.Contains(body, "sandbox app") {
			t.Errorf("GET after DeleteService = %v %q %v, want 404", resp, body, err)
		}
	})
	t.Run("removed with the sandbox", func(t *testing.T) {
		if _, err := c.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "web", Service: "again", TargetPort: 80}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "web"}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			list, err := c.ListServices(ctx, &openshellv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.GetServices()) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("services of deleted sandbox %s remain: %v", sb.GetMetadata().GetId(), list)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// wsEchoRoundTrip upgrades a plaintext connection to the service host to
// WebSocket and checks that a masked text frame comes back.
func wsEchoRoundTrip(t *testing.T, addr, host string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	keyRaw := make([]byte, 16)
	_, _ = rand.Read(keyRaw)
	key := base64.StdEncoding.EncodeToString(keyRaw)
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nOrigin: http://%s\r\n\r\n", host, key, host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // empty for a 101; the connection carries the frames
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Fatalf("upgrade = %s %v, want 101 with the accept key", resp.Status, resp.Header)
	}
	wsEcho(t, conn, br)
}

// wsEcho writes a masked text frame to w and checks that r brings it back.
func wsEcho(t *testing.T, w io.Writer, br io.Reader) {
	t.Helper()
	msg := []byte("hello through the relay")
	mask := [4]byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask[:]...)
	for i, b := range msg {
		frame = append(frame, b^mask[i%4])
	}
	if _, err := w.Write(frame); err != nil {
		t.Fatal(err)
	}
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatal(err)
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var b [2]byte
		_, _ = io.ReadFull(br, b[:])
		n = int(binary.BigEndian.Uint16(b[:]))
	}
	got := make([]byte, n)
	if _, err := io.ReadFull(br, got); err != nil {
		t.Fatal(err)
	}
	if h[0] != 0x81 || string(got) != string(msg) {
		t.Fatalf("echo frame = %#x %q, want text %q", h[0], got, msg)
	}
}

// chromiumDOM loads url in headless Chromium (which resolves *.localhost to
// loopback itself) and checks the DOM after the page's script ran. Without
// chromium the test skips, and fails under CI=true.
func chromiumDOM(t *testing.T, url string, flags ...string) {
	t.Helper()
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		citest.SkipOrFail(t, "chromium is not installed (test/install-deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir=" + TempDir(t), "--virtual-time-budget=5000", "--dump-dom"}, flags...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", url, err, stderr.String())
	}
	_, host, _ := strings.Cut(strings.TrimSuffix(url, "/"), "://")
	for _, want := range []string{`<h1 id="title">sandbox app</h1>`, `<p id="status">rendered by ` + host + `</p>`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("chromium DOM of %s lacks %q:\n%s", url, want, out)
		}
	}
}
