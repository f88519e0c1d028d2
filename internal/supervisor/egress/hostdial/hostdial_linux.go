// Package hostdial lets the supervisor, inside a network namespace with
// loopback only, open TCP connections in the host's network namespace.
//
// The process driver (outside the sandbox) creates a SOCK_SEQPACKET socket
// pair before it starts the supervisor, keeps one end and passes the other
// as an inherited file descriptor. For each dial the supervisor creates a
// fresh reply socket pair and sends one end with the request, a literal
// "ip:port" (names are resolved and checked by the supervisor, so the
// dialer does no DNS); the driver dials from its own namespace and sends
// the connected socket back over the reply socket (SCM_RIGHTS), or an
// error text. A socket keeps the network namespace it was created in, so
// the supervisor then reads and writes an ordinary host TCP connection.
//
// Nothing inside the sandbox can use the channel: the supervisor's end is
// close-on-exec, and agent processes run unprivileged and cannot reach the
// supervisor's descriptors.
//
// The inherited channel ends when the driver's process (the gateway)
// exits. A driver that re-attaches running supervisors after a restart
// also serves the dialer on a SOCK_SEQPACKET listening socket only the
// supervisor's user may connect to (Listen); a Client made with a redial
// function connects to it again when a request finds the channel broken.
package hostdial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Pair returns the two ends of a new channel: serve is the driver's end
// (for Serve), child is passed to the supervisor and closed by the driver
// once the child started.
func Pair() (serve *net.UnixConn, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("host dialer socket pair: %w", err)
	}
	child = os.NewFile(uintptr(fds[1]), "hostdial-child")
	serve, err = unixConn(os.NewFile(uintptr(fds[0]), "hostdial-serve"))
	if err != nil {
		child.Close()
		return nil, nil, err
	}
	return serve, child, nil
}

// unixConn turns f into a *net.UnixConn (non-blocking, closable while a
// read waits) and closes f.
func unixConn(f *os.File) (*net.UnixConn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("host dialer socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("host dialer socket: %T is not a unix socket", c)
	}
	return uc, nil
}

const maxRequest = 128

// Serve answers dial requests on conn until the other end closes (the
// supervisor exited) or conn is closed, then waits for the dials in
// flight. allow, when set, refuses addresses this dialer must never reach
// whatever the supervisor asks.
func Serve(conn *net.UnixConn, timeout time.Duration, allow func(netip.AddrPort) error) error {
	return serve(context.Background(), conn, timeout, allow)
}

// serve is Serve whose dials in flight end when ctx does.
func serve(ctx context.Context, conn *net.UnixConn, timeout time.Duration, allow func(netip.AddrPort) error) error {
	defer conn.Close() //nolint:errcheck // ends the channel
	var wg sync.WaitGroup
	defer wg.Wait()
	buf := make([]byte, maxRequest)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if n == 0 && oobn == 0 {
			return nil // peer closed
		}
		reply, err := oneFD(oob[:oobn])
		if err != nil {
			continue // a request without a reply socket cannot be answered
		}
		req := string(buf[:n])
		wg.Go(func() {
			defer unix.Close(reply) //nolint:errcheck
			answer(ctx, reply, req, timeout, allow)
		})
	}
}

func answer(ctx context.Context, reply int, req string, timeout time.Duration, allow func(netip.AddrPort) error) {
	fail := func(err error) { _ = unix.Sendmsg(reply, []byte("E"+err.Error()), nil, nil, 0) }
	ap, err := netip.ParseAddrPort(req)
	if err != nil {
		fail(fmt.Errorf("dial request %q is not an ip:port", req))
		return
	}
	if allow != nil {
		if err := allow(ap); err != nil {
			fail(err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		fail(err)
		return
	}
	defer c.Close()
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		fail(err)
		return
	}
	// A failed send leaves the requester reading a closed reply socket.
	_ = sc.Control(func(fd uintptr) {
		_ = unix.Sendmsg(reply, []byte("K"), unix.UnixRights(int(fd)), nil, 0)
	})
}

func oneFD(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, errors.New("no descriptor")
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) == 0 {
		return -1, errors.New("no descriptor")
	}
	for _, fd := range fds[1:] {
		unix.Close(fd) //nolint:errcheck
	}
	return fds[0], nil
}

// Client is the supervisor's end.
type Client struct {
	redial func() (*net.UnixConn, error)
	mu     sync.Mutex
	c      *net.UnixConn // nil after a failed redial
	closed bool
}

// NewClient takes over the inherited end f. redial, when not nil,
// connects a new channel (for example with DialSocket) when a request
// finds the current one broken because the driver's process ended.
func NewClient(f *os.File, redial func() (*net.UnixConn, error)) (*Client, error) {
	c, err := unixConn(f)
	if err != nil {
		return nil, err
	}
	return &Client{c: c, redial: redial}, nil
}

// NewSocketClient is a Client with no inherited channel: it connects to
// the dialer socket at path (served by Listen) on its first request and
// again whenever a request finds the channel broken. For a supervisor
// that inherits no descriptor from its driver (a Docker container, which
// gets the socket's directory bind-mounted instead).
func NewSocketClient(path string) *Client {
	return &Client{redial: func() (*net.UnixConn, error) { return DialSocket(path) }}
}

// DialSocket connects to a dialer socket served by Listen.
func DialSocket(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("host dialer socket: %w", err)
	}
	return c, nil
}

// Close closes the channel.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.c == nil {
		return nil
	}
	return c.c.Close()
}

// send writes one request on the channel, reconnecting once when the
// channel is broken (or was not re-established yet) and a redial
// function is set.
func (c *Client) send(req []byte, oob []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	var err error
	if c.c != nil {
		if _, _, err = c.c.WriteMsgUnix(req, oob, nil); err == nil || c.redial == nil {
			return err
		}
		_ = c.c.Close()
		c.c = nil
	}
	if c.redial == nil {
		return err
	}
	nc, rerr := c.redial()
	if rerr != nil {
		if err != nil {
			return fmt.Errorf("%w; reconnect: %w", err, rerr)
		}
		return rerr
	}
	c.c = nc
	_, _, err = c.c.WriteMsgUnix(req, oob, nil)
	return err
}

// Dial asks the host side to connect to addr and returns the connection.
func (c *Client) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("host dial %s: %w", addr, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("host dial %s: %w", addr, err)
	}
	mine, err := unixConn(os.NewFile(uintptr(fds[0]), "hostdial-reply"))
	if err != nil {
		unix.Close(fds[1]) //nolint:errcheck
		return nil, err
	}
	defer mine.Close() //nolint:errcheck // the reply socket of one dial
	err = c.send([]byte(addr.String()), unix.UnixRights(fds[1]))
	unix.Close(fds[1]) //nolint:errcheck
	if err != nil {
		return nil, fmt.Errorf("host dial %s: the host dialer is gone: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = mine.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = mine.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := mine.ReadMsgUnix(buf, oob)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("host dial %s: %w", addr, err)
	case n == 0:
		return nil, fmt.Errorf("host dial %s: the host dialer closed the request", addr)
	case buf[0] == 'E':
		return nil, fmt.Errorf("host dial %s: %s", addr, buf[1:n])
	}
	fd, err := oneFD(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("host dial %s: reply without a connection", addr)
	}
	f := os.NewFile(uintptr(fd), "upstream")
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("host dial %s: %w", addr, err)
	}
	if err := ctx.Err(); err != nil {
		// The reply raced the cancellation: the caller gave up already.
		conn.Close()
		return nil, fmt.Errorf("host dial %s: %w", addr, err)
	}
	return conn, nil
}

// Listener serves the dialer on a unix SOCK_SEQPACKET socket, one Serve
// per accepted connection, for peers running as one host uid only.
type Listener struct {
	ln     *net.UnixListener
	path   string
	uid    int
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	conns  map[*net.UnixConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen serves the dialer on the socket name in directory dir (replacing
// a stale one), owned by uid:gid with mode 0600, and accepts only peers
// whose uid is uid. timeout and allow are as for Serve.
func Listen(dir, name string, uid, gid int, timeout time.Duration, allow func(netip.AddrPort) error) (*Listener, error) {
	path := dir + "/" + name
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Bound through the directory's fd: sun_path holds 108 bytes only.
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name), Net: "unixpacket"})
	unix.Close(dfd) //nolint:errcheck
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	err = os.Lchown(path, uid, gid)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{ln: ln, path: path, uid: uid, ctx: ctx, cancel: cancel, conns: map[*net.UnixConn]struct{}{}}
	l.wg.Go(func() { l.serve(timeout, allow) })
	return l, nil
}

func (l *Listener) serve(timeout time.Duration, allow func(netip.AddrPort) error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors and the like: try again
			continue
		}
		if uid, err := peerUID(c); err != nil || uid != l.uid {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Go(func() {
			_ = serve(l.ctx, c, timeout, allow)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
		})
	}
}

func peerUID(c *net.UnixConn) (int, error) {
	sc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := sc.Control(func(fd uintptr) { cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, err
	}
	if gerr != nil {
		return -1, gerr
	}
	return int(cred.Uid), nil
}

// Close stops listening, ends every channel and the dials in flight,
// removes the socket and waits for the listener's goroutines.
func (l *Listener) Close() {
	l.cancel()
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
	_ = os.Remove(l.path)
}
