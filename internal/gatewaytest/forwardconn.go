package gatewaytest

import (
	"context"
	"io"
	"net"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// ForwardConn is a net.Conn over one ForwardTcp stream (what the CLI's
// `sandbox connect` tunnels SSH through): the supervisor relay without the
// gateway's HTTP proxy. Close calls stop, which should cancel the stream's
// context. Deadlines are not supported and are ignored.
func ForwardConn(s openshellv1.OpenShell_ForwardTcpClient, stop context.CancelFunc) net.Conn {
	return &forwardConn{s: s, stop: stop}
}

type forwardConn struct {
	s    openshellv1.OpenShell_ForwardTcpClient
	buf  []byte
	stop context.CancelFunc
}

func (c *forwardConn) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		f, err := c.s.Recv()
		if err != nil {
			return 0, io.EOF
		}
		c.buf = f.GetData()
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *forwardConn) Write(p []byte) (int, error) {
	if err := c.s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: append([]byte(nil), p...)}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *forwardConn) Close() error                     { c.stop(); return nil }
func (c *forwardConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *forwardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *forwardConn) SetDeadline(time.Time) error      { return nil }
func (c *forwardConn) SetReadDeadline(time.Time) error  { return nil }
func (c *forwardConn) SetWriteDeadline(time.Time) error { return nil }
