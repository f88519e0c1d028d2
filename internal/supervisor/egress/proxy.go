package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
}

// Event is one decision, as logged. It never carries credentials, paths,
// query strings or bodies.
type Event struct {
	Time     time.Time
	Kind     string // "connect" or "http"
	Binary   string
	PID      int
	Host     string
	IP       string // the address dialed ("" when denied before dialing)
	Port     uint32
	Policy   string
	Decision string // "allow" or "deny"
	Reason   string
}

// Proxy is the sandbox's egress proxy: HTTP CONNECT and absolute-form
// forward HTTP, one policy decision per client connection.
type Proxy struct {
	cfg     Config
	snap    atomic.Pointer[Snapshot]
	guard   ssrfGuard
	Denials *Denials

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // client and upstream connections in flight
	closed bool
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
	defer p.wg.Wait()
	defer p.closeAll()
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

func (p *Proxy) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "malformed proxy request")
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	ev := Event{Kind: "http"}
	var host string
	var port uint32
	if req.Method == http.MethodConnect {
		ev.Kind = "connect"
		host, port, err = splitHostPort(req.Host, 0)
	} else {
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			writeStatus(c, http.StatusBadRequest, "the proxy takes CONNECT or absolute-form http:// requests")
			return
		}
		host, port, err = splitHostPort(req.URL.Host, 80)
	}
	if err != nil {
		writeStatus(c, http.StatusBadRequest, err.Error())
		return
	}
	ev.Host, ev.Port = host, port

	upstream, status := p.decideAndDial(c, host, port, &ev)
	ev.Time = time.Now()
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev)
	}
	if upstream == nil {
		if ev.Decision == "deny" {
			p.Denials.Add(ev.Binary, host, port)
		}
		writeStatus(c, status, ev.Reason)
		return
	}
	defer upstream.Close()
	if !p.track(upstream) {
		return
	}
	defer p.untrack(upstream)
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
			return
		}
		splice(c, br, upstream)
		return
	}
	forward(c, req, upstream)
}

// decideAndDial identifies the caller, decides, resolves once, applies the
// SSRF guard and dials a checked address. On failure it returns nil and
// the HTTP status to answer; ev carries the decision either way.
func (p *Proxy) decideAndDial(c net.Conn, host string, port uint32, ev *Event) (net.Conn, int) {
	deny := func(status int, format string, args ...any) (net.Conn, int) {
		ev.Decision, ev.Reason = "deny", fmt.Sprintf(format, args...)
		return nil, status
	}
	var callers []Caller
	if p.cfg.Identify != nil {
		client, err1 := netip.ParseAddrPort(c.RemoteAddr().String())
		server, err2 := netip.ParseAddrPort(c.LocalAddr().String())
		if err := errors.Join(err1, err2); err != nil {
			return deny(http.StatusForbidden, "cannot identify the calling process: %v", err)
		}
		var err error
		if callers, err = p.cfg.Identify(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), netip.AddrPortFrom(server.Addr().Unmap(), server.Port())); err != nil {
			return deny(http.StatusForbidden, "cannot identify the calling process: %v", err)
		}
	}
	if len(callers) == 0 {
		callers = []Caller{{}}
	}
	ev.Binary, ev.PID = callers[0].Exe, callers[0].PID
	snap := p.snap.Load()
	if snap == nil {
		return deny(http.StatusForbidden, "no network policy loaded")
	}
	// Every process holding the socket must be allowed: a socket handed
	// to an allowed binary by another process gains nothing.
	decisions := make([]Decision, 0, len(callers))
	for _, cl := range callers {
		if cl.Err != nil {
			ev.Binary, ev.PID = cl.Exe, cl.PID
			return deny(http.StatusForbidden, "%v", cl.Err)
		}
		di := snap.Decide(Request{Host: host, Port: port, Exe: cl.Exe, Ancestors: cl.Ancestors})
		if !di.Allow {
			ev.Binary, ev.PID, ev.Policy = cl.Exe, cl.PID, ""
			return deny(http.StatusForbidden, "%s", di.Reason)
		}
		decisions = append(decisions, di)
	}
	ev.Policy = decisions[0].Policy
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	addrs, err := resolve(ctx, p.cfg.Resolver, host)
	if err != nil {
		return deny(http.StatusForbidden, "%v", err)
	}
	for _, d := range decisions { // each holder's matching endpoint must admit the addresses
		if err := p.guard.check(addrs, d.AllowedIPs, d.Hostless); err != nil {
			return deny(http.StatusForbidden, "%v", err)
		}
	}
	var last error
	for _, a := range addrs {
		up, err := p.cfg.Dial(ctx, netip.AddrPortFrom(a.Unmap(), uint16(port)))
		if err == nil {
			ev.Decision, ev.IP = "allow", a.Unmap().String()
			return up, 0
		}
		last = err
	}
	ev.Decision, ev.Reason = "allow", fmt.Sprintf("upstream unreachable: %v", last)
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

// splice pumps bytes both ways until both directions end; br holds what
// the client sent after the CONNECT header.
func splice(c net.Conn, br *bufio.Reader, up net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Flush what bufio already read, then copy from the connection
		// itself: TCP to TCP is spliced in the kernel (bufio's WriteTo
		// would hide the *net.TCPConn and copy through user space).
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			if _, err := up.Write(b); err != nil {
				closeWrite(up)
				return
			}
		}
		_, _ = io.Copy(up, c)
		closeWrite(up)
	}()
	_, _ = io.Copy(c, up)
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
// relays the response. The connection closes afterwards: the next request
// is a new connection and a new decision.
func forward(c net.Conn, req *http.Request, up net.Conn) {
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
	req.Close = true
	if err := req.Write(up); err != nil {
		writeStatus(c, http.StatusBadGateway, "upstream write failed")
		return
	}
	_, _ = io.Copy(c, up)
}
