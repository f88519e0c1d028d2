package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/openshell-go/openshell/internal/securityevent"
)

// Caller is one process holding the client end of a proxied connection.
type Caller struct {
	PID       int
	Exe       string   // /proc/<pid>/exe
	Ancestors []string // parents' executables, nearest first
	// Err is set when the caller's binary fails its integrity check
	// (trust on first use): such a caller is always denied.
	Err error
}

// Config configures a Proxy.
type Config struct {
	// Resolver resolves destination names once per connection; nil is
	// the system resolver (of the namespace the supervisor resolves in).
	Resolver Resolver
	// Dial opens the upstream connection to a checked address, from
	// outside the sandbox's network namespace.
	Dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// Identify names the processes holding the client end of a
	// connection (client is its address, server the proxy's). nil
	// leaves callers unidentified: then a rule's binaries never match.
	Identify func(client, server netip.AddrPort) ([]Caller, error)
	// OwnAddrs are the gateway's own addresses (SSRF guard).
	OwnAddrs []netip.Prefix
	// OnEvent receives every decision.
	OnEvent func(Event)
	// DialTimeout bounds resolution plus dial (default 10s).
	DialTimeout time.Duration
	// CA terminates TLS in CONNECT tunnels to endpoints with protocol
	// rest; nil ends such TLS tunnels without forwarding.
	CA *CA
	// UpstreamRoots returns the pool that verifies upstream certificates
	// of terminated tunnels, called at each upstream handshake (so a pool
	// built on first call costs nothing before the first one); nil or a
	// nil pool: the system roots.
	UpstreamRoots func() *x509.CertPool
	// Metrics counts every decision; nil counts nothing.
	Metrics *Metrics
	// Credentials resolves credential placeholders in every HTTP request
	// (plain and inside terminated tunnels) after its admission; nil
	// forwards requests as they are.
	Credentials Credentials
	// Inference, when set, answers requests for host InferenceHost (any
	// port) instead of the network policy: absolute-form requests, and
	// the requests of CONNECT tunnels (TLS terminated with CA); it
	// reports whether the client connection may carry another request.
	Inference func(c net.Conn, req *http.Request, caller Caller) bool
	// PolicyLocal, when set, answers absolute-form http:// requests for
	// host PolicyLocalHost (port 80) instead of the network policy; the
	// connection closes after its answer (see servePolicyLocal).
	PolicyLocal func(c net.Conn, req *http.Request, caller Caller)
}

// InferenceHost is the host Config.Inference serves.
const InferenceHost = "inference.local"

// Event is one decision, as logged. It never carries credentials, query
// strings, headers or bodies.
type Event struct {
	Time   time.Time
	Kind   string // "connect" or "http"
	Binary string
	PID    int
	Host   string
	IP     string // the address dialed ("" when denied before dialing)
	Port   uint32
	Policy string
	// Method and Path are set for http requests: the method and, for
	// endpoints with protocol rest, the canonical path (never the query).
	Method   string
	Path     string
	Decision string // "allow", "deny" or "audit" (a REST violation logged and allowed)
	Reason   string
	// Finding names a detection a denial is also reported as:
	// FindingSSRF or FindingCredentialMismatch ("" for none).
	Finding string
}

// Findings of Event.Finding, as the gateway's security event log reads
// them from the decision lines.
const (
	// FindingSSRF: the SSRF guard refused the destination (an internal,
	// the gateway's own or a cloud metadata address or name).
	FindingSSRF = securityevent.FindingSSRF
	// FindingCredentialMismatch: a credential placeholder was sent to an
	// endpoint its provider's profile does not cover.
	FindingCredentialMismatch = securityevent.FindingCredentialMismatch
)

// Proxy is the sandbox's egress proxy: HTTP CONNECT (one decision per
// tunnel) and absolute-form forward HTTP (one decision per request).
type Proxy struct {
	cfg     Config
	snap    atomic.Pointer[Snapshot]
	pool    upPool // idle upstream connections of plain HTTP requests
	tlsPool upPool // idle upstream TLS connections of terminated tunnels
	guard   ssrfGuard
	Denials *Denials

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // client and upstream connections in flight
	closed bool

	// onTunnel, when set, sees the two connections of each relayed
	// tunnel before its bytes are copied (tests).
	onTunnel func(client, upstream net.Conn)
}

// New returns a proxy deciding with snap until SetSnapshot.
func New(cfg Config, snap *Snapshot) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	p := &Proxy{cfg: cfg, guard: ssrfGuard{own: cfg.OwnAddrs}, Denials: NewDenials(256)}
	p.snap.Store(snap)
	return p
}

// SetSnapshot makes snap the policy of every connection accepted from now
// on; connections already decided keep their decision.
func (p *Proxy) SetSnapshot(snap *Snapshot) { p.snap.Store(snap) }

// Serve accepts connections on ln until it is closed (other accept errors
// are retried with backoff), then closes the
// connections in flight (an idle tunnel would otherwise hold the
// supervisor's shutdown) and waits for their handlers.
func (p *Proxy) Serve(ln net.Listener) error {
	defer p.tlsPool.drain(p.discard)
	defer p.pool.drain(p.discard)
	defer p.wg.Wait()
	defer p.closeAll()
	// Idle upstream connections past idleTimeout are closed even when no
	// request comes to take them.
	stop := make(chan struct{})
	defer close(stop)
	p.wg.Go(func() {
		t := time.NewTicker(idleTimeout / 2)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				p.pool.sweep(p.discard)
				p.tlsPool.sweep(p.discard)
			}
		}
	})
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors (an agent holding many connections) and
			// the like pass: keep serving, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Go(func() {
			defer p.untrack(c)
			p.handle(c)
		})
	}
}

// track registers c; false once the proxy is shutting down.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
}

const headerTimeout = 30 * time.Second

// Header limits (OpenShell's architecture/sandbox-limits.md): the first
// request of a connection (CONNECT or HTTP) may carry 8 KiB of headers,
// a later request on a kept-alive connection 16 KiB. Bodies are streamed,
// never buffered.
const (
	connectHeaderLimit = 8 << 10
	httpHeaderLimit    = 16 << 10
	bufSize            = 4096
)

func (p *Proxy) handle(c net.Conn) {
	defer c.Close()
	cr := &capReader{r: c}
	br := bufio.NewReaderSize(cr, bufSize)
	req, status, msg := readRequest(c, cr, br, connectHeaderLimit)
	if req == nil {
		writeStatus(c, status, msg)
		return
	}
	var callers []Caller
	var idErr error
	if p.cfg.Identify != nil {
		callers, idErr = p.identify(c)
	}
	if len(callers) == 0 {
		callers = []Caller{{}}
	}
	if req.Method != http.MethodConnect {
		p.serveHTTP(c, cr, br, req, callers, idErr)
		return
	}
	ev := Event{Kind: "connect"}
	host, port, err := splitHostPort(req.Host, 0)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, err.Error())
		return
	}
	if p.cfg.Inference != nil && strings.EqualFold(host, InferenceHost) {
		p.serveInferenceTunnel(c, br, callers[0])
		return
	}
	if strings.EqualFold(host, PolicyLocalHost) {
		// Plain HTTP only; never a policy decision (a denial would
		// become a draft chunk for policy.local itself).
		WriteJSON(c, http.StatusBadRequest, map[string]any{"error": "invalid_policy_local_scheme", "detail": "Use http://policy.local only"})
		return
	}
	ev.Host, ev.Port = host, port
	decisions, status := p.decide(callers, idErr, host, port, &ev)
	var upstream net.Conn
	var pooled *upConn // an idle TLS connection for an inspected tunnel
	inspect := decisions != nil && inspectTunnel(decisions)
	if decisions != nil && skipped(decisions) {
		ev.Reason = "tls skip: the tunnel is relayed uninspected, REST rules do not apply"
	}
	if inspect {
		pooled = p.tlsPool.take(host, port, func(u *upConn) bool { return p.recheck(decisions, u.ip) == nil }, p.discard)
	}
	switch {
	case pooled != nil:
		ev.IP = pooled.ipText
		if ev.Decision == "" {
			ev.Decision = "allow"
		}
	case decisions != nil:
		upstream, status = p.dial(decisions, host, port, &ev)
	}
	p.emit(&ev)
	if upstream == nil && pooled == nil {
		writeStatus(c, status, ev.Reason)
		return
	}
	if upstream != nil && !p.track(upstream) {
		upstream.Close()
		return
	}
	if inspect {
		// serveInspected owns upstream and pooled from here.
		p.serveInspected(c, br, upstream, pooled, decisions, host, port, req.Host, ev)
		return
	}
	defer upstream.Close()
	defer p.untrack(upstream)
	if _, err := io.WriteString(c, connectOK); err != nil {
		return
	}
	if p.onTunnel != nil {
		p.onTunnel(c, upstream)
	}
	relay(c, br, upstream)
}

const connectOK = "HTTP/1.1 200 Connection Established\r\n\r\n"

// acceptTunnel answers a CONNECT with 200 and peeks at the tunnel's first
// byte (within headerTimeout). It returns the tunnel's client side (br's
// buffered bytes first) and whether the client starts a TLS handshake; ok
// is false when the client is gone.
func acceptTunnel(c net.Conn, br *bufio.Reader) (client net.Conn, hello, ok bool) {
	if _, err := io.WriteString(c, connectOK); err != nil {
		return nil, false, false
	}
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	first, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, false, false
	}
	return &prefixConn{Conn: c, r: br}, first[0] == 0x16, true // 0x16: a TLS handshake record
}

// capReader lets the request reader bound header sizes: while limit > 0,
// reads stop (hit) once limit bytes came through.
type capReader struct {
	r     io.Reader
	n     int64 // bytes read so far
	limit int64 // absolute n at which reads stop (0: unlimited)
	hit   bool
}

func (r *capReader) Read(b []byte) (int, error) {
	if r.limit > 0 {
		left := r.limit - r.n
		if left <= 0 {
			r.hit = true
			return 0, errHeaderTooLarge
		}
		if int64(len(b)) > left {
			b = b[:left]
		}
	}
	n, err := r.r.Read(b)
	r.n += int64(n)
	return n, err
}

var errHeaderTooLarge = errors.New("request headers too large")

// readRequest reads one request whose header (request line and fields)
// may be at most limit bytes. On failure it returns nil and the status
// and text to answer (status 0: the client closed between requests).
func readRequest(c net.Conn, cr *capReader, br *bufio.Reader, limit int64) (*http.Request, int, string) {
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	start := cr.n - int64(br.Buffered())
	cr.limit, cr.hit = start+limit+bufSize, false
	req, err := http.ReadRequest(br)
	used := cr.n - int64(br.Buffered()) - start
	cr.limit = 0
	_ = c.SetReadDeadline(time.Time{})
	switch {
	case cr.hit || (err == nil && used > limit):
		return nil, http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("request headers exceed %d bytes", limit)
	case err != nil && used == 0:
		return nil, 0, ""
	case err != nil:
		return nil, http.StatusBadRequest, "malformed proxy request"
	}
	return req, 0, ""
}

// serveHTTP forwards absolute-form http:// requests of one client
// connection, deciding each request on its own (the connection is kept
// alive when client and upstream allow it): the caller's network decision
// against the current snapshot, then, for endpoints with protocol rest,
// the request's method, path and query. The upstream connection is reused
// while requests name the same host and port.
func (p *Proxy) serveHTTP(c net.Conn, cr *capReader, br *bufio.Reader, req *http.Request, callers []Caller, idErr error) {
	var up *upConn
	clean := false // up is at a message boundary, reusable
	var last connDecision
	cw := bufio.NewWriterSize(c, bufSize)
	defer func() {
		if up != nil {
			p.release(up, clean)
		}
	}()
	for {
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			writeStatus(c, http.StatusBadRequest, "the proxy takes CONNECT or absolute-form http:// requests")
			return
		}
		host, port, err := splitHostPort(req.URL.Host, 80)
		if err != nil {
			writeStatus(c, http.StatusBadRequest, err.Error())
			return
		}
		if strings.EqualFold(host, PolicyLocalHost) {
			p.servePolicyLocal(c, req, port, callers[0])
			return
		}
		if p.cfg.Inference != nil && strings.EqualFold(host, InferenceHost) {
			if !p.cfg.Inference(c, req, callers[0]) {
				return
			}
			var code int
			if req, code, _ = readRequest(c, cr, br, httpHeaderLimit); req == nil {
				if code != 0 {
					writeStatus(c, code, fmt.Sprintf("request headers exceed %d bytes", httpHeaderLimit))
				}
				return
			}
			continue
		}
		ev := Event{Kind: "http", Host: host, Port: port, Method: req.Method}
		decisions, status := p.decideConn(&last, callers, idErr, host, port, &ev)
		if decisions == nil {
			p.emit(&ev)
			writeStatus(c, status, ev.Reason)
			return
		}
		if inspected(decisions) {
			if !p.inspect(c, req, decisions, &ev) {
				return
			}
		}
		if !p.resolveCredentials(c, req, decisions, host, port, &ev) {
			return
		}
		admit := func(u *upConn) bool { return p.recheck(decisions, u.ip) == nil }
		if up != nil && (up.host != host || up.port != port || !admit(up)) {
			// Another destination, or this caller's policy no longer
			// admits its address: it goes back to the pool, whose take
			// checks the policy of the request it serves next.
			p.release(up, clean)
			up = nil
		}
		if up == nil {
			up = p.pool.take(host, port, admit, p.discard)
		}
		if up == nil {
			if up, status = p.dialUp(decisions, host, port, &ev); up == nil {
				p.emit(&ev)
				writeStatus(c, status, ev.Reason)
				return
			}
		} else {
			ev.IP = up.ipText
			if ev.Decision == "" {
				ev.Decision = "allow"
			}
		}
		p.emit(&ev)
		next, ok, retry := forward(c, cw, req, up, true)
		if retry {
			// A reused connection the upstream had closed: once more on a
			// new one (the request has no body and no side effects).
			p.discard(up)
			again := ev
			if up, status = p.dialUp(decisions, host, port, &again); up == nil {
				writeStatus(c, status, again.Reason)
				return
			}
			next, ok, _ = forward(c, cw, req, up, false)
		}
		// A clean connection has carried a whole exchange: reused from
		// now on, here or from the pool.
		up.reused = ok
		if clean = ok; !next {
			return
		}
		req, status, _ = readRequest(c, cr, br, httpHeaderLimit)
		if req == nil {
			if status != 0 {
				writeStatus(c, status, fmt.Sprintf("request headers exceed %d bytes", httpHeaderLimit))
			}
			return
		}
	}
}

// dialUp dials a checked address for host:port (see dial) and tracks the
// connection; nil and the status to answer when that fails, with ev's
// decision and reason set.
func (p *Proxy) dialUp(decisions []Decision, host string, port uint32, ev *Event) (*upConn, int) {
	conn, status := p.dial(decisions, host, port, ev)
	if conn == nil {
		return nil, status
	}
	if !p.track(conn) {
		conn.Close()
		ev.Reason = "the proxy is shutting down"
		return nil, http.StatusServiceUnavailable
	}
	return newUpstream(conn, host, port, netip.MustParseAddr(ev.IP)), 0
}

// release returns u to the pool when reusable (at a message boundary) and
// the pool has room, else closes it.
func (p *Proxy) release(u *upConn, reusable bool) {
	p.releaseTo(&p.pool, u, reusable)
}

func (p *Proxy) releaseTo(pool *upPool, u *upConn, reusable bool) {
	if reusable && pool.put(u) {
		return
	}
	p.discard(u)
}

// discard closes u.
func (p *Proxy) discard(u *upConn) {
	u.Close()
	p.untrack(u.tracked)
}

// upConn is a connection to a checked destination with its buffers,
// kept across the requests of a client connection.
type upConn struct {
	net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	host string
	port uint32
	ip   netip.Addr // the checked address dialed
	// ipText is ip as events name it (formatted once, not per request).
	ipText string
	// tracked is the connection Proxy.track knows (the TCP connection
	// under a TLS one).
	tracked net.Conn
	// reused: it has carried a whole exchange already (so the upstream
	// may have closed it since); idleSince: when it entered the pool.
	reused    bool
	idleSince time.Time
}

func newUpstream(c net.Conn, host string, port uint32, ip netip.Addr) *upConn {
	return &upConn{Conn: c, tracked: c, br: bufio.NewReaderSize(c, bufSize), bw: bufio.NewWriterSize(c, bufSize), host: host, port: port, ip: ip, ipText: ip.String()}
}

// recheck applies the SSRF guard of decisions to ip, an address already
// resolved and dialed for the same host (no new lookup), so a reused
// connection follows the current policy's allowed_ips.
func (p *Proxy) recheck(decisions []Decision, ip netip.Addr) error {
	for _, d := range decisions {
		if err := p.guard.check([]netip.Addr{ip}, d.AllowedIPs, d.Hostless); err != nil {
			return err
		}
	}
	return nil
}

// inspect applies the REST rules of decisions to req. It returns false
// when the request is refused (the answer is written, the connection
// ends); an audited violation returns true with ev.Decision "audit".
func (p *Proxy) inspect(c net.Conn, req *http.Request, decisions []Decision, ev *Event) bool {
	allowSlash := true
	for _, d := range decisions {
		for _, l := range d.l7 {
			allowSlash = allowSlash && l.allowEncodedSlash
		}
	}
	path, err := canonicalPath(req.URL.EscapedPath(), allowSlash)
	if err != nil {
		ev.Decision, ev.Reason = "deny", err.Error()
		p.emit(ev)
		writeStatus(c, http.StatusBadRequest, err.Error())
		return false
	}
	ev.Path = path
	q, err := url.ParseQuery(req.URL.RawQuery)
	if err != nil {
		ev.Decision, ev.Reason = "deny", "request-target has a malformed query"
		p.emit(ev)
		writeStatus(c, http.StatusBadRequest, ev.Reason)
		return false
	}
	lr := &l7Request{method: req.Method, path: path, query: q}
	// Every holder of the socket must be allowed, as for the connection.
	for _, d := range decisions {
		if len(d.l7) == 0 {
			continue // this holder's rule has no REST endpoint: not inspected
		}
		v := decideL7(d.l7, lr)
		if v.allowed {
			continue
		}
		ev.Reason = v.reason
		if !v.enforce {
			ev.Decision = "audit"
			continue
		}
		ev.Decision = "deny"
		p.emit(ev)
		writeL7Deny(c, ev)
		return false
	}
	// Send the path that was decided on, not the client's spelling.
	req.URL.Opaque = path
	return true
}

// writeL7Deny answers an enforced REST denial as OpenShell does: 403 with
// a JSON body naming the policy, method, path (no query) and reason.
func writeL7Deny(c net.Conn, ev *Event) {
	body, _ := json.Marshal(map[string]any{
		"error": "policy_denied", "policy": ev.Policy, "rule": ev.Method + " " + ev.Path, "detail": ev.Reason,
		"layer": "l7", "protocol": "rest", "method": ev.Method, "path": ev.Path,
		"host": ev.Host, "port": ev.Port, "binary": ev.Binary,
	})
	_, _ = fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-OpenShell-Policy: %s\r\nConnection: close\r\n\r\n%s",
		len(body), headerSafe(ev.Policy), body)
}

func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
}

// emit stamps ev, reports it, counts it and adds a denial to Denials.
func (p *Proxy) emit(ev *Event) {
	ev.Time = time.Now()
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(*ev)
	}
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.count(ev)
	}
	if ev.Decision == "deny" {
		p.Denials.AddReason(ev.Binary, ev.Host, ev.Port, ev.Reason)
	}
}

// identify names the processes holding the client end of c.
func (p *Proxy) identify(c net.Conn) ([]Caller, error) {
	client, err1 := netip.ParseAddrPort(c.RemoteAddr().String())
	server, err2 := netip.ParseAddrPort(c.LocalAddr().String())
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	t0 := time.Now()
	callers, err := p.cfg.Identify(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), netip.AddrPortFrom(server.Addr().Unmap(), server.Port()))
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.identify.Observe(time.Since(t0).Seconds())
	}
	return callers, err
}

// decide decides host:port for every caller against the current snapshot.
// On denial it returns nil and the status to answer; ev carries the
// decision's binary, pid, policy and (on denial) reason either way.
func (p *Proxy) decide(callers []Caller, idErr error, host string, port uint32, ev *Event) ([]Decision, int) {
	return p.decideWith(p.snap.Load(), callers, idErr, host, port, ev)
}

// connDecision is a client connection's last allowing decision: a next
// request of the connection (same callers) to the same host and port
// under the same snapshot is allowed by the same decisions, as each
// snapshot decides a request always alike, without deciding again.
type connDecision struct {
	snap      *Snapshot
	host      string
	port      uint32
	decisions []Decision
	binary    string
	pid       int
	policy    string
}

// decideConn is decide for a request of the connection whose last
// allowing decision is last, which it updates.
func (p *Proxy) decideConn(last *connDecision, callers []Caller, idErr error, host string, port uint32, ev *Event) ([]Decision, int) {
	snap := p.snap.Load()
	if last.decisions != nil && last.snap == snap && last.host == host && last.port == port {
		ev.Binary, ev.PID, ev.Policy = last.binary, last.pid, last.policy
		return last.decisions, 0
	}
	decisions, status := p.decideWith(snap, callers, idErr, host, port, ev)
	if decisions != nil {
		*last = connDecision{snap: snap, host: host, port: port, decisions: decisions, binary: ev.Binary, pid: ev.PID, policy: ev.Policy}
	}
	return decisions, status
}

func (p *Proxy) decideWith(snap *Snapshot, callers []Caller, idErr error, host string, port uint32, ev *Event) ([]Decision, int) {
	deny := func(format string, args ...any) ([]Decision, int) {
		ev.Decision, ev.Reason = "deny", fmt.Sprintf(format, args...)
		return nil, http.StatusForbidden
	}
	if idErr != nil {
		return deny("cannot identify the calling process: %v", idErr)
	}
	ev.Binary, ev.PID = callers[0].Exe, callers[0].PID
	if snap == nil {
		return deny("no network policy loaded")
	}
	// Every process holding the socket must be allowed: a socket handed
	// to an allowed binary by another process gains nothing.
	decisions := make([]Decision, 0, len(callers))
	for _, cl := range callers {
		if cl.Err != nil {
			ev.Binary, ev.PID = cl.Exe, cl.PID
			return deny("%v", cl.Err)
		}
		di := snap.Decide(Request{Host: host, Port: port, Exe: cl.Exe, Ancestors: cl.Ancestors})
		if !di.Allow {
			ev.Binary, ev.PID, ev.Policy = cl.Exe, cl.PID, ""
			return deny("%s", di.Reason)
		}
		decisions = append(decisions, di)
	}
	ev.Policy = decisions[0].Policy
	return decisions, 0
}

// dial resolves host once, applies the SSRF guard for every decision and
// dials a checked address. On failure it returns nil and the HTTP status
// to answer, with ev's decision and reason set.
func (p *Proxy) dial(decisions []Decision, host string, port uint32, ev *Event) (net.Conn, int) {
	deny := func(status int, format string, args ...any) (net.Conn, int) {
		ev.Decision, ev.Reason = "deny", fmt.Sprintf(format, args...)
		return nil, status
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	addrs, err := resolve(ctx, p.cfg.Resolver, host)
	if err != nil {
		var mh metadataHostError
		if errors.As(err, &mh) {
			ev.Finding = FindingSSRF
		}
		return deny(http.StatusForbidden, "%v", err)
	}
	for _, d := range decisions { // each holder's matching endpoint must admit the addresses
		if err := p.guard.check(addrs, d.AllowedIPs, d.Hostless); err != nil {
			ev.Finding = FindingSSRF
			return deny(http.StatusForbidden, "%v", err)
		}
	}
	var last error
	for _, a := range addrs {
		up, err := p.cfg.Dial(ctx, netip.AddrPortFrom(a.Unmap(), uint16(port)))
		if err == nil {
			if ev.Decision == "" {
				ev.Decision = "allow"
			}
			ev.IP = a.Unmap().String()
			return up, 0
		}
		last = err
	}
	if ev.Decision == "" {
		ev.Decision = "allow"
	}
	ev.Reason = fmt.Sprintf("upstream unreachable: %v", last)
	return nil, http.StatusBadGateway
}

func splitHostPort(authority string, defPort uint32) (string, uint32, error) {
	host, ps, err := net.SplitHostPort(authority)
	if err != nil {
		if defPort == 0 {
			return "", 0, fmt.Errorf("proxy target %q needs host:port", authority)
		}
		host, ps = strings.Trim(authority, "[]"), strconv.Itoa(int(defPort))
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("proxy target %q has an invalid port", authority)
	}
	if host == "" || strings.ContainsAny(host, " /\\@?#%") {
		return "", 0, fmt.Errorf("proxy target %q has an invalid host", authority)
	}
	return host, uint32(n), nil
}

func writeStatus(c net.Conn, code int, msg string) {
	body := msg + "\n"
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// relay pumps bytes both ways until both directions end; br holds what
// the client sent after the CONNECT header.
func relay(c net.Conn, br *bufio.Reader, up net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Flush what bufio already read, then copy from the connection
		// itself (bufio's WriteTo would hide the *net.TCPConn pump needs).
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			if _, err := up.Write(b); err != nil {
				closeWrite(up)
				return
			}
		}
		pump(up, c)
		closeWrite(up)
	}()
	pump(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// hopHeaders are removed from forwarded requests (RFC 9110 section 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// forward sends one absolute-form request upstream in origin form and
// relays the response. It reports whether the client connection may carry
// another request (neither side asked to close and both messages ended
// cleanly: next), whether the upstream connection may (clean), and, with
// canRetry, whether a reused upstream connection ended before any answer
// to a replayable request (retry: nothing was written to the client).
func forward(c net.Conn, cw *bufio.Writer, req *http.Request, up *upConn, canRetry bool) (next, clean, retry bool) {
	for _, h := range req.Header.Values("Connection") {
		for _, name := range strings.Split(h, ",") {
			req.Header.Del(strings.TrimSpace(name))
		}
	}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	// req.Host is the URL's host (http.ReadRequest prefers it to a Host
	// header for absolute-form requests), so the upstream sees the host
	// the decision was about.
	req.RequestURI = ""
	// Connection: close from the client is hop-by-hop: it ends the client
	// connection after this exchange, not the upstream one.
	clientClose := req.Close
	req.Close = false
	writeDone := writeRequest(c, req, up)
	upBR := up.br
	// The first byte is awaited apart: an end of stream before it (the
	// upstream closed a reused connection) is told from a broken answer
	// (ReadResponse reports both as io.ErrUnexpectedEOF).
	var resp *http.Response
	_, err := upBR.Peek(1)
	if err == nil {
		resp, err = http.ReadResponse(upBR, req)
	}
	// Interim responses (100 Continue, 103 Early Hints) are relayed and
	// the final one follows.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		if err = resp.Write(c); err != nil {
			break
		}
		resp, err = http.ReadResponse(upBR, req)
	}
	if err != nil {
		_ = up.Close() // unblocks the writer
		writeDone()
		if canRetry && up.reused && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) && replayable(req) {
			// The upstream closed the reused connection without a byte
			// of answer, or reset it: nothing reached the client yet.
			return false, false, true
		}
		writeStatus(c, http.StatusBadGateway, "no valid upstream response")
		return false, false, false
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Upgrade was removed from the request: a switch is not relayed.
		writeStatus(c, http.StatusBadGateway, "upstream switched protocols")
		writeDone()
		return false, false, false
	}
	// The header goes out in one write; the body is flushed before every
	// read that would wait for upstream, so a streamed response is not
	// held back (and a response already read whole leaves in one write).
	bw := cw
	bw.Reset(c)
	resp.Body = flushBeforeRead{resp.Body, bw, upBR}
	// (Without ReadFrom: bufio's would read into its own buffer while
	// the body's Read flushes it.)
	if err := resp.Write(noReadFrom{bw}); err != nil || bw.Flush() != nil {
		writeDone()
		return false, false, false
	}
	if !writeDone() {
		return false, false, false
	}
	clean = !resp.Close
	return clean && !clientClose, clean, false
}

// writeRequest sends req upstream and returns the function that waits
// for the sending to end and reports whether the whole request went out.
// A request with a body is written while the response is read: an
// upstream answering 100 Continue waits for a body the client sends only
// after that answer; a writer still blocked a second after the response
// (an early final answer, a body never sent) is unblocked by failing its
// client read. A request without a body is written at once.
func writeRequest(c net.Conn, req *http.Request, up *upConn) (done func() bool) {
	if req.ContentLength == 0 && len(req.TransferEncoding) == 0 {
		req.Body = nil
		err := req.Write(up.bw)
		if err == nil {
			err = up.bw.Flush()
		}
		return func() bool { return err == nil }
	}
	werr := make(chan error, 1)
	go func() { werr <- req.Write(up) }()
	return func() bool {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case err := <-werr:
			return err == nil
		case <-t.C:
			_ = c.SetReadDeadline(time.Now())
			// A writer that still completes sent the whole request;
			// readRequest sets a new deadline for the next one.
			err := <-werr
			return err == nil
		}
	}
}

// noReadFrom is a bufio.Writer without its ReadFrom; WriteString stays,
// so headers are written without converting each string.
type noReadFrom struct{ w *bufio.Writer }

func (n noReadFrom) Write(p []byte) (int, error)       { return n.w.Write(p) }
func (n noReadFrom) WriteString(s string) (int, error) { return n.w.WriteString(s) }

// flushBeforeRead is a response body that flushes the client writer
// before a read that may wait for upstream (nothing buffered from it).
type flushBeforeRead struct {
	io.ReadCloser
	w  *bufio.Writer
	br *bufio.Reader
}

func (f flushBeforeRead) Read(p []byte) (int, error) {
	if f.br.Buffered() == 0 {
		if err := f.w.Flush(); err != nil {
			return 0, err
		}
	}
	return f.ReadCloser.Read(p)
}
