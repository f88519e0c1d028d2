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
			answer(reply, req, timeout, allow)
		})
	}
}

func answer(reply int, req string, timeout time.Duration, allow func(netip.AddrPort) error) {
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
	c, err := net.DialTimeout("tcp", ap.String(), timeout)
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
	c *net.UnixConn
}

// NewClient takes over the inherited end f.
func NewClient(f *os.File) (*Client, error) {
	c, err := unixConn(f)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// Close closes the channel.
func (c *Client) Close() error { return c.c.Close() }

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
	_, _, err = c.c.WriteMsgUnix([]byte(addr.String()), unix.UnixRights(fds[1]), nil)
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
