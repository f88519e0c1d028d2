package relay

import (
	"net"
	"os"
	"sync"
	"time"
)

// Conn is the gateway's end of one relay: a net.Conn whose bytes travel as
// RelayFrame data on the supervisor's RelayStream call.
//
// Reads take frames straight from the stream and writes hand 16 KiB chunks to
// the stream's sender, one at a time, so neither direction buffers more than
// one frame (gRPC flow control provides the backpressure). Close ends the
// RelayStream call; the supervisor then closes its local connection. When the
// supervisor half-closes (its target reached EOF), Read returns io.EOF while
// Write keeps working until Close. Deadlines are not supported.
type Conn struct {
	channelID string
	sandboxID string

	readCh  chan []byte // closed by the stream's receiver after setting readErr
	readErr error
	rbuf    []byte
	rmu     sync.Mutex

	writeCh chan []byte
	wmu     sync.Mutex

	closed    chan struct{}
	closeOnce sync.Once

	ended   chan struct{} // closed when the RelayStream handler returns
	endErr  error
	endOnce sync.Once
}

func newConn(channelID, sandboxID string) *Conn {
	return &Conn{
		channelID: channelID,
		sandboxID: sandboxID,
		readCh:    make(chan []byte),
		writeCh:   make(chan []byte),
		closed:    make(chan struct{}),
		ended:     make(chan struct{}),
	}
}

// ChannelID is the relay's channel id.
func (c *Conn) ChannelID() string { return c.channelID }

// SandboxID is the sandbox whose supervisor serves the relay.
func (c *Conn) SandboxID() string { return c.sandboxID }

func (c *Conn) finish(err error) {
	c.endOnce.Do(func() {
		if err == nil {
			err = net.ErrClosed
		}
		c.endErr = err
		close(c.ended)
	})
}

// Done is closed when the relay stream has ended.
func (c *Conn) Done() <-chan struct{} { return c.ended }

// Read implements io.Reader.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.rbuf) == 0 {
		select {
		case b, ok := <-c.readCh:
			if !ok {
				return 0, c.readErr
			}
			c.rbuf = b
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, c.rbuf)
	c.rbuf = c.rbuf[n:]
	return n, nil
}

// Write implements io.Writer. It returns once every chunk of p has been
// handed to the stream's sender.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		k := min(len(p), ChunkSize)
		b := make([]byte, k)
		copy(b, p[:k])
		select {
		case c.writeCh <- b:
		case <-c.closed:
			return n, net.ErrClosed
		case <-c.ended:
			return n, c.endErr
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Close ends the relay. It is safe to call more than once.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

type relayAddr string

func (a relayAddr) Network() string { return "openshell-relay" }
func (a relayAddr) String() string  { return string(a) }

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return relayAddr("gateway") }

// RemoteAddr implements net.Conn; it names the sandbox and channel.
func (c *Conn) RemoteAddr() net.Addr { return relayAddr(c.sandboxID + "/" + c.channelID) }

// SetDeadline implements net.Conn; deadlines are not supported.
func (c *Conn) SetDeadline(time.Time) error { return os.ErrNoDeadline }

// SetReadDeadline implements net.Conn; deadlines are not supported.
func (c *Conn) SetReadDeadline(time.Time) error { return os.ErrNoDeadline }

// SetWriteDeadline implements net.Conn; deadlines are not supported.
func (c *Conn) SetWriteDeadline(time.Time) error { return os.ErrNoDeadline }

var _ net.Conn = (*Conn)(nil)
