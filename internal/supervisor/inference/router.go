// Package inference is the supervisor's inference.local router. Agent
// processes reach http(s)://inference.local through the sandbox's egress
// proxy (HTTP_PROXY, HTTPS_PROXY); the proxy hands every request for that
// host (terminating TLS for https) to Router.Serve instead of deciding it
// against the network policy. The router matches the request to a protocol
// (OpenShell's patterns: chat completions, completions, responses,
// embeddings, messages, model discovery), picks the bundle's
// inference.local route serving it, and sends the request to the
// resolved upstream with the route's real credential, dropping whatever
// credential the agent sent (package internal/inference does the
// shaping).
//
// Responses stream back as they arrive: each chunk read from the upstream
// is written to the agent at once (SSE passes through unbuffered). The
// route's timeout (60 s when unset) bounds the wait for the upstream's
// response headers and every gap between body chunks, so a long stream
// that keeps producing is never cut.
//
// The bundle comes from the gateway (GetInferenceBundle) and is replaced
// whole by Set; Poll refreshes it when its revision changes. Without an
// inference.local route the router answers 503 "cluster inference is not
// configured". Every request is logged as a decision (allow or deny),
// never with headers, bodies or credentials.
//
// Router is safe for concurrent use.
package inference

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	domain "github.com/openshell-go/openshell/internal/inference"
)

// Host is the name agents reach the router under.
const Host = "inference.local"

// maxRequestBody bounds an agent's request body (it is rewritten whole).
const maxRequestBody = 32 << 20

// Options configure a Router.
type Options struct {
	Logger *slog.Logger
	// Dial opens upstream connections (from outside the sandbox's network
	// namespace); nil dials directly.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs returns the pool that verifies upstream certificates,
	// called once, at the first upstream request (so a pool built on
	// first call costs nothing before it); nil or a nil pool: the system
	// pool.
	RootCAs func() *x509.CertPool
}

type bundle struct {
	routes   []*inferencev1.ResolvedRoute
	revision string
}

// Router serves inference.local requests.
type Router struct {
	log    *slog.Logger
	bundle atomic.Pointer[bundle]
	client func() *http.Client // built at the first upstream request
}

// New returns a router without routes (every request answers 503 until
// Set).
func New(o Options) *Router {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Router{log: o.Logger, client: sync.OnceValue(func() *http.Client { return newClient(o) })}
	r.bundle.Store(&bundle{})
	return r
}

// newClient returns the client of upstream requests.
func newClient(o Options) *http.Client {
	var roots *x509.CertPool
	if o.RootCAs != nil {
		roots = o.RootCAs()
	}
	tr := &http.Transport{
		DialContext:         o.Dial,
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if tr.DialContext == nil {
		tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return &http.Client{
		Transport: tr,
		// Redirects go back to the agent, never followed with the key.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Set installs the routes of b for requests from now on; requests in
// flight finish on the routes they started with.
func (r *Router) Set(b *inferencev1.GetInferenceBundleResponse) {
	var routes []*inferencev1.ResolvedRoute
	for _, rt := range b.GetRoutes() {
		if rt.GetName() == domain.RouteLocal {
			routes = append(routes, rt)
		}
	}
	r.bundle.Store(&bundle{routes: routes, revision: b.GetRevision()})
}

// Revision is the revision of the installed bundle ("" before Set).
func (r *Router) Revision() string { return r.bundle.Load().revision }

// Caller names the agent process behind a request, for the log.
type Caller struct {
	Binary string
	PID    int
}

// decision is one logged request.
type decision struct {
	caller   Caller
	method   string
	path     string
	protocol string
	upstream string // host of the upstream URL
	status   int
	allow    bool
	reason   string
	start    time.Time
}

func (r *Router) logDecision(d *decision) {
	level, verdict := slog.LevelInfo, "allow"
	if !d.allow {
		level, verdict = slog.LevelWarn, "deny"
	}
	r.log.Log(context.Background(), level, "inference "+verdict,
		"decision", verdict, "kind", "inference", "binary", d.caller.Binary, "pid", strconv.Itoa(d.caller.PID),
		"host", Host, "method", d.method, "path", d.path, "protocol", d.protocol, "upstream", d.upstream,
		"status", d.status, "reason", d.reason, "duration_ms", time.Since(d.start).Milliseconds())
}

// Serve answers req, read from the agent's connection c, and reports
// whether c may carry another request. It consumes req.Body.
func (r *Router) Serve(c net.Conn, req *http.Request, caller Caller) bool {
	path := req.URL.EscapedPath()
	d := &decision{caller: caller, method: req.Method, path: path, start: time.Now()}
	defer r.logDecision(d)
	keep := !req.Close && req.ProtoAtLeast(1, 1)
	deny := func(status int, msg, hint string) bool {
		d.status, d.reason = status, msg
		body := map[string]string{"error": msg}
		if hint != "" {
			body["hint"] = hint
		}
		// The unread body would be taken for the next request.
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, maxRequestBody))
		return writeJSON(c, status, body) && keep
	}
	protocol, ok := domain.Match(req.Method, path)
	if !ok {
		return deny(http.StatusForbidden, "connection not allowed by policy", "")
	}
	d.protocol = protocol
	b := r.bundle.Load()
	if len(b.routes) == 0 {
		return deny(http.StatusServiceUnavailable, "cluster inference is not configured", "run: openshell inference set --help")
	}
	route := domain.Select(b.routes, protocol)
	if route == nil {
		return deny(http.StatusBadRequest, "no compatible inference route available", "")
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxRequestBody+1))
	if err != nil {
		d.status, d.reason = 0, "reading the request body: "+err.Error()
		return false
	}
	if len(body) > maxRequestBody {
		return deny(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxRequestBody), "")
	}
	d.allow = true
	return r.forward(c, req, route, body, d) && keep
}

// forward sends the request upstream and relays the answer. It reports
// whether the agent's connection is still usable.
func (r *Router) forward(c net.Conn, req *http.Request, route *inferencev1.ResolvedRoute, body []byte, d *decision) bool {
	body, stream := domain.Body(route, body)
	target := domain.URL(route, req.URL.RequestURI(), stream)
	if u, err := req.URL.Parse(target); err == nil {
		d.upstream = u.Host
	}
	timeout := domain.Timeout(route)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// timer cancels the upstream request when the route's timeout passes
	// without headers or without a body chunk.
	var timedOut atomic.Bool
	timer := time.AfterFunc(timeout, func() { timedOut.Store(true); cancel() })
	defer timer.Stop()

	up, err := http.NewRequestWithContext(ctx, req.Method, target, bytes.NewReader(body))
	if err != nil {
		d.status, d.reason = http.StatusBadGateway, "invalid upstream URL"
		return writeJSON(c, http.StatusBadGateway, map[string]string{"error": "inference service error"})
	}
	up.Header = domain.Headers(route, req.Header)
	up.ContentLength = int64(len(body))
	resp, err := r.client().Do(up)
	if err != nil {
		d.status = http.StatusServiceUnavailable
		d.reason = "upstream unavailable: " + upstreamError(err, timedOut.Load(), timeout)
		return writeJSON(c, http.StatusServiceUnavailable, map[string]string{"error": "inference service unavailable"})
	}
	defer resp.Body.Close()
	d.status = resp.StatusCode
	return relay(c, resp, req.ProtoAtLeast(1, 1), timer, timeout, &timedOut, d)
}

// upstreamError describes a failed upstream call without the URL's
// userinfo or query (the transport's error names the URL).
func upstreamError(err error, timedOut bool, timeout time.Duration) string {
	if timedOut {
		return fmt.Sprintf("no response within the route's timeout of %s", timeout)
	}
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && ue.Unwrap() != nil {
		return ue.Unwrap().Error()
	}
	return err.Error()
}

// hopByHop are response fields the router does not relay (it frames the
// body itself).
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// relay writes resp to the agent: headers, then each body chunk as it
// arrives (chunked framing, or the upstream's Content-Length when known).
// An HTTP/1.0 agent gets an unknown length as a body ending with the
// connection (it cannot read chunked framing).
func relay(c net.Conn, resp *http.Response, http11 bool, timer *time.Timer, timeout time.Duration, timedOut *atomic.Bool, d *decision) bool {
	// Writes to bw fail sticky; every Flush reports them.
	bw := bufio.NewWriterSize(c, 4096)
	chunked := resp.ContentLength < 0 && http11
	closeDelimited := resp.ContentLength < 0 && !http11
	_, _ = fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", resp.StatusCode, statusText(resp.StatusCode))
	for k, vs := range resp.Header {
		if hopByHop[k] {
			continue
		}
		for _, v := range vs {
			_, _ = fmt.Fprintf(bw, "%s: %s\r\n", k, v)
		}
	}
	switch {
	case chunked:
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
	case closeDelimited:
		_, _ = bw.WriteString("Connection: close\r\n")
	default:
		_, _ = fmt.Fprintf(bw, "Content-Length: %d\r\n", resp.ContentLength)
	}
	_, _ = bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		return false
	}
	buf := make([]byte, 32<<10)
	var sent int64
	for {
		timer.Reset(timeout)
		n, err := resp.Body.Read(buf)
		if n > 0 {
			sent += int64(n)
			if chunked {
				_, _ = fmt.Fprintf(bw, "%x\r\n", n)
				_, _ = bw.Write(buf[:n])
				_, _ = bw.WriteString("\r\n")
			} else {
				_, _ = bw.Write(buf[:n])
			}
			// Flush per chunk: streamed tokens reach the agent now.
			if bw.Flush() != nil {
				d.reason = "agent went away"
				return false
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The agent sees a truncated body (no final chunk); the
			// connection cannot carry another request.
			d.reason = "upstream body: " + upstreamError(err, timedOut.Load(), timeout)
			return false
		}
	}
	if chunked {
		_, _ = bw.WriteString("0\r\n\r\n")
		if bw.Flush() != nil {
			return false
		}
	} else if closeDelimited || sent != resp.ContentLength {
		return false
	}
	return true
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "Status " + strconv.Itoa(code)
}

// writeJSON answers a router-made response; false when c failed.
func writeJSON(c net.Conn, status int, v any) bool {
	b, _ := json.Marshal(v)
	_, err := fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, statusText(status), len(b), b)
	return err == nil
}
