package services

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // RFC 6455 defines Sec-WebSocket-Accept with SHA-1
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// isH2WebSocket reports whether req opens a WebSocket over HTTP/2 (RFC
// 8441): an extended CONNECT with :protocol websocket. Go's HTTP/2 server
// accepts those only when the process runs with GODEBUG=http2xconnect=1.
func isH2WebSocket(req *http.Request) bool {
	return req.ProtoMajor == 2 && req.Method == http.MethodConnect && strings.EqualFold(req.Header.Get(":protocol"), "websocket")
}

// wsGUID is RFC 6455's key suffix.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// webSocketHeaders pass from the browser's extended CONNECT to the app's
// HTTP/1.1 upgrade, besides the ones the upgrade sets itself.
var webSocketSkip = map[string]bool{
	"Host": true, "Connection": true, "Upgrade": true, "Sec-Websocket-Key": true, "Content-Length": true,
	"Transfer-Encoding": true, "Te": true, "Keep-Alive": true, "Proxy-Connection": true, ":protocol": true,
}

// serveH2WebSocket bridges an RFC 8441 WebSocket stream to the app's
// HTTP/1.1 WebSocket upgrade over one relay connection: the frames are
// the same on both sides, only the handshake differs. The app's answer to
// the upgrade is checked (101 with the right accept key) before the
// browser gets 200.
func (r *Router) serveH2WebSocket(w http.ResponseWriter, req *http.Request, u upstream) {
	ctx := req.Context()
	conn, err := r.dial(ctx, "tcp", u.host)
	if err != nil {
		r.log.Debug("service websocket dial failed", "host", req.Host, "error", err)
		plain(w, http.StatusBadGateway, "Service endpoint is not reachable")
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	keyRaw := make([]byte, 16)
	_, _ = rand.Read(keyRaw)
	key := base64.StdEncoding.EncodeToString(keyRaw)
	out := &http.Request{
		Method: http.MethodGet, URL: &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		Host: "127.0.0.1:" + strconv.FormatUint(uint64(u.port), 10),
	}
	for k, vs := range req.Header {
		if !webSocketSkip[k] {
			out.Header[k] = vs
		}
	}
	for _, h := range gatewayAuthHeaders {
		out.Header.Del(h)
	}
	out.Header.Set("Connection", "Upgrade")
	out.Header.Set("Upgrade", "websocket")
	out.Header.Set("Sec-WebSocket-Key", key)
	if out.Header.Get("Sec-WebSocket-Version") == "" {
		out.Header.Set("Sec-WebSocket-Version", "13")
	}
	if ip, _, err := net.SplitHostPort(req.RemoteAddr); err == nil {
		out.Header.Set("X-Forwarded-For", ip)
	}
	out.Header.Set("X-Forwarded-Host", req.Host)
	out.Header.Set("X-Forwarded-Proto", map[bool]string{true: "https", false: "http"}[req.TLS != nil])

	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := out.Write(conn); err != nil {
		plain(w, http.StatusBadGateway, "Service endpoint is not reachable")
		return
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, out)
	if err != nil {
		r.log.Debug("service websocket handshake failed", "host", req.Host, "error", err)
		plain(w, http.StatusBadGateway, "Service endpoint is not reachable")
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode < 300 {
			// A 2xx would tell the browser the WebSocket is open.
			plain(w, http.StatusBadGateway, "Service endpoint did not accept the WebSocket upgrade")
			return
		}
		// The app refused the upgrade: pass its answer on.
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return
	}
	sum := sha1.Sum([]byte(key + wsGUID)) //nolint:gosec // RFC 6455
	if !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		plain(w, http.StatusBadGateway, "Service endpoint answered the WebSocket upgrade wrongly")
		return
	}
	for _, h := range []string{"Sec-WebSocket-Protocol", "Sec-WebSocket-Extensions"} {
		if v := resp.Header.Values(h); len(v) > 0 {
			w.Header()[h] = v
		}
	}
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Browser to app; the browser ending its stream half-closes.
		_, _ = io.Copy(conn, req.Body)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	})
	// App to browser, flushed as it comes.
	_, _ = io.Copy(flushWriter{w, rc}, br)
	_ = conn.Close()
	_ = req.Body.Close()
	wg.Wait()
}

// flushWriter flushes each write: WebSocket frames must not wait in a
// buffer.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		if ferr := f.rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
			return n, ferr
		}
	}
	return n, err
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
}
