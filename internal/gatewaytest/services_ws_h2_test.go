package gatewaytest

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestServiceWebSocketHTTP2 opens a WebSocket to a sandbox's app over
// HTTP/2 (RFC 8441 extended CONNECT) on a gateway started with
// GODEBUG=http2xconnect=1, the switch Go's HTTP/2 server needs, and checks
// the echo; the app itself speaks HTTP/1.1.
func TestServiceWebSocketHTTP2(t *testing.T) {
	g := Start(t, Options{Env: []string{"GODEBUG=http2xconnect=1"}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	_, url := exposeWebApp(ctx, t, g, "wsh2")
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	tc := g.clientTLS()
	tc.ServerName = strings.Split(host, ":")[0]
	tc.NextProtos = []string{"h2"}
	// net/http's Transport refuses the ":protocol" pseudo-header; the
	// x/net client sends RFC 8441 extended CONNECT.
	tr := &http2.Transport{TLSClientConfig: tc, DialTLSContext: func(ctx context.Context, network, _ string, cfg *tls.Config) (net.Conn, error) { //nolint:staticcheck // SA1019: see above
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, network, g.Addr)
	}}
	t.Cleanup(tr.CloseIdleConnections) //nolint:staticcheck // SA1019: see above

	// stream is one extended CONNECT: the answer's status, and the two
	// directions of the tunnel.
	type stream struct {
		status, proto int
		r             io.Reader
		w             io.Writer
	}
	connect := func(path string) stream {
		t.Helper()
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		req, err := http.NewRequestWithContext(ctx, http.MethodConnect, "https://"+host+path, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(":protocol", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Origin", "https://"+host)
		resp, err := tr.RoundTrip(req) //nolint:staticcheck // SA1019: see above
		if err != nil {
			t.Fatalf("extended CONNECT %s: %v", path, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return stream{status: resp.StatusCode, proto: resp.ProtoMajor, r: resp.Body, w: pw}
	}
	ws := connect("/ws")
	if ws.status != http.StatusOK || ws.proto != 2 {
		b, _ := io.ReadAll(ws.r)
		t.Fatalf("extended CONNECT = HTTP/%d %d %q, want 200 over HTTP/2", ws.proto, ws.status, b)
	}
	wsEcho(t, ws.w, ws.r)
	wsEcho(t, ws.w, ws.r) // the stream stays open for more frames

	// A path where the app answers a page, not an upgrade: no tunnel.
	if page := connect("/"); page.status != http.StatusBadGateway {
		t.Errorf("extended CONNECT to a non-WebSocket path = %d, want 502", page.status)
	}
}
