package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// tunnelChunk is the largest data frame sent on ForwardTcp; well under the
// gateway's 1 MiB message limit.
const tunnelChunk = 64 << 10

// tunnel is one ForwardTcp stream used as a byte stream. Read and Write may
// be called concurrently with each other (one reader, one writer).
type tunnel struct {
	stream grpc.BidiStreamingClient[openshellv1.TcpForwardFrame, openshellv1.TcpForwardFrame]
	cancel context.CancelFunc

	sendMu sync.Mutex
	closed bool
	buf    []byte

	errMu   sync.Mutex
	recvErr error // first receive error other than EOF
}

// remoteErr returns the gateway's error that ended the stream, if any.
func (t *tunnel) remoteErr() error {
	t.errMu.Lock()
	defer t.errMu.Unlock()
	return t.recvErr
}

// openTunnel starts ForwardTcp and sends init. The init carries the session
// token; it is never logged.
func (a *app) openTunnel(ctx context.Context, init *openshellv1.TcpForwardInit) (*tunnel, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := a.client.ForwardTcp(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := stream.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: init}}); err != nil {
		cancel()
		// Send reports io.EOF when the server already ended the stream;
		// the real status comes from Recv.
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv()
		}
		return nil, err
	}
	return &tunnel{stream: stream, cancel: cancel}, nil
}

func sshInit(sandboxID, token string) *openshellv1.TcpForwardInit {
	return &openshellv1.TcpForwardInit{
		SandboxId:          sandboxID,
		ServiceId:          "ssh-proxy:" + sandboxID,
		Target:             &openshellv1.TcpForwardInit_Ssh{Ssh: &openshellv1.SshRelayTarget{}},
		AuthorizationToken: token,
	}
}

func tcpInit(sandboxID, token string, port uint32) *openshellv1.TcpForwardInit {
	return &openshellv1.TcpForwardInit{
		SandboxId:          sandboxID,
		Target:             &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: port}},
		AuthorizationToken: token,
	}
}

func (t *tunnel) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		f, err := t.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.errMu.Lock()
				if t.recvErr == nil {
					t.recvErr = err
				}
				t.errMu.Unlock()
			}
			return 0, err
		}
		t.buf = f.GetData()
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

func (t *tunnel) Write(p []byte) (int, error) {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if t.closed {
		return 0, net.ErrClosed
	}
	written := 0
	for len(p) > 0 {
		n := min(len(p), tunnelChunk)
		chunk := append([]byte(nil), p[:n]...)
		if err := t.stream.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: chunk}}); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// CloseWrite half-closes the stream: the remote sees EOF.
func (t *tunnel) CloseWrite() error {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	return t.stream.CloseSend()
}

// Close ends the stream in both directions.
func (t *tunnel) Close() error {
	_ = t.CloseWrite()
	t.cancel()
	return nil
}

// tunnelConn adapts a tunnel to net.Conn for the SSH client.
type tunnelConn struct{ *tunnel }

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "openshell" }
func (tunnelAddr) String() string  { return "openshell-relay" }

func (tunnelConn) LocalAddr() net.Addr              { return tunnelAddr{} }
func (tunnelConn) RemoteAddr() net.Addr             { return tunnelAddr{} }
func (tunnelConn) SetDeadline(time.Time) error      { return nil }
func (tunnelConn) SetReadDeadline(time.Time) error  { return nil }
func (tunnelConn) SetWriteDeadline(time.Time) error { return nil }

// bridge copies bytes both ways between local and t until both directions
// end. Local EOF half-closes the tunnel; tunnel EOF half-closes local when
// it supports CloseWrite. Both copy goroutines are joined before return.
func bridge(local io.ReadWriteCloser, t *tunnel) error {
	var wg sync.WaitGroup
	var upErr, downErr error
	wg.Go(func() {
		_, upErr = io.Copy(t, local)
		_ = t.CloseWrite()
	})
	wg.Go(func() {
		_, downErr = io.Copy(local, t)
		if cw, ok := local.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = local.Close()
		}
		if downErr != nil {
			// The remote side failed: unblock the upstream copy.
			_ = local.Close()
		}
	})
	wg.Wait()
	_ = local.Close()
	_ = t.Close()
	if downErr != nil && !errors.Is(downErr, io.EOF) {
		return downErr
	}
	if upErr != nil && !errors.Is(upErr, net.ErrClosed) {
		return upErr
	}
	return nil
}
