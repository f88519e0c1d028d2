package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials"
)

// clientPreface starts every HTTP/2 connection.
const clientPreface = http2.ClientPreface

// maxSniffBytes bounds what the listener reads before it knows where a
// connection goes.
const maxSniffBytes = 1 << 20

// sniffedConn replays the bytes read while classifying a connection and
// remembers the TLS state of a connection the listener terminated.
type sniffedConn struct {
	net.Conn
	buf []byte
	// r, when set, replaces Conn for reads once buf is drained.
	r   io.Reader
	tls *tls.ConnectionState
}

func (c *sniffedConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	if c.r != nil {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

// tlsSniffedConn exposes ConnectionState so the HTTP/2 server sees TLS.
type tlsSniffedConn struct{ *sniffedConn }

func (c tlsSniffedConn) ConnectionState() tls.ConnectionState { return *c.tls }

type connKind int

const (
	kindHTTP1 connKind = iota + 1
	kindHTTP2
	kindGRPC
)

// classify reads the first bytes of raw: TLS (0x16 0x03) is terminated
// with tlsConf, then the HTTP/2 preface tells HTTP/1.x from HTTP/2, and the
// content-type of the first HTTP/2 request tells gRPC from plain HTTP.
// The returned conn replays everything read. When tlsConf requires client
// certificates, plaintext is refused unless plainHTTP is set, and even then
// plaintext gRPC is refused (the HTTP handler serves only service hosts).
func classify(ctx context.Context, raw net.Conn, tlsConf *tls.Config, timeout time.Duration, plainHTTP bool) (connKind, net.Conn, error) {
	if err := raw.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, nil, err
	}
	first := make([]byte, 0, 64)
	first, err := readAtLeast(raw, first, 2)
	if err != nil {
		return 0, nil, err
	}
	inner := raw
	var state *tls.ConnectionState
	if first[0] == 0x16 && first[1] == 0x03 {
		if tlsConf == nil {
			return 0, nil, errors.New("tls client on a plaintext listener")
		}
		tc := tls.Server(&sniffedConn{Conn: raw, buf: first}, tlsConf)
		hctx, cancel := context.WithTimeout(ctx, timeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return 0, nil, err
		}
		st := tc.ConnectionState()
		state = &st
		inner = tc
		first = make([]byte, 0, 64)
	}
	plainOnlyHTTP := state == nil && tlsConf != nil && tlsConf.ClientAuth == tls.RequireAndVerifyClientCert
	if plainOnlyHTTP && !plainHTTP {
		return 0, nil, errors.New("plaintext client while client certificates are required")
	}
	// Read until the bytes diverge from the HTTP/2 preface or complete it.
	for len(first) < len(clientPreface) && strings.HasPrefix(clientPreface, string(first)) {
		if first, err = readAtLeast(inner, first, len(first)+1); err != nil {
			return 0, nil, err
		}
	}
	c := &sniffedConn{Conn: inner, buf: first, tls: state}
	if !strings.HasPrefix(string(first), clientPreface) {
		return finish(raw, kindHTTP1, c)
	}
	isGRPC, acked, err := sniffHTTP2(c)
	if err != nil {
		return 0, nil, err
	}
	if isGRPC {
		if plainOnlyHTTP {
			return 0, nil, errors.New("plaintext gRPC client while client certificates are required")
		}
		return finish(raw, kindGRPC, c)
	}
	if !acked {
		// The client acknowledges our early SETTINGS later; the HTTP/2
		// server must not see an acknowledgement it did not ask for.
		c.r = &settingsAckFilter{r: bufio.NewReader(io.MultiReader(bytes.NewReader(c.buf), inner))}
		c.buf = nil
	}
	return finish(raw, kindHTTP2, c)
}

func finish(raw net.Conn, k connKind, c *sniffedConn) (connKind, net.Conn, error) {
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return 0, nil, err
	}
	if c.tls != nil && k == kindHTTP2 {
		return k, tlsSniffedConn{c}, nil
	}
	return k, c, nil
}

func readAtLeast(r io.Reader, buf []byte, n int) ([]byte, error) {
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil && len(buf) < n {
			return buf, err
		}
	}
	return buf, nil
}

// earlySettings is the SETTINGS frame the listener sends before it knows
// which server takes the connection. RFC 9218 §2.1 forbids changing
// SETTINGS_NO_RFC7540_PRIORITIES after the first SETTINGS frame, and both
// servers behind the listener ignore RFC 7540 priorities: the HTTP/2
// server announces NO_RFC7540_PRIORITIES=1 in its own SETTINGS (its
// default RFC 9218 scheduler), and grpc-go never used them. Announcing the
// same value here keeps the second SETTINGS frame from being a change,
// which nghttp2 (curl) answers with GOAWAY PROTOCOL_ERROR.
//
// When the HTTP/2 server accepts extended CONNECT (RFC 8441, WebSocket
// over HTTP/2), the early frame says so too: clients decide from the
// first SETTINGS frame whether they may use it (Go's client waits for that
// frame and never looks again). grpc-go does not send the setting, which
// is no change either.
var earlySettings = func() []http2.Setting {
	s := []http2.Setting{{ID: http2.SettingNoRFC7540Priorities, Val: 1}}
	if ExtendedConnect {
		s = append(s, http2.Setting{ID: http2.SettingEnableConnectProtocol, Val: 1})
	}
	return s
}()

// ExtendedConnect reports whether the HTTP/2 server accepts extended
// CONNECT: golang.org/x/net/http2 turns it on only for a process started
// with GODEBUG=http2xconnect=1, read once at start the same way.
var ExtendedConnect = strings.Contains(os.Getenv("GODEBUG"), "http2xconnect=1")

// sniffHTTP2 sends earlySettings (clients such as grpc-go wait for the
// server's preface before they send a request), then reads frames
// up to the first HEADERS and reports whether its content-type is gRPC.
// c.buf is rewritten to replay the preface and every frame read, minus the
// acknowledgement of our SETTINGS, which is reported in acked.
func sniffHTTP2(c *sniffedConn) (isGRPC, acked bool, err error) {
	var rec bytes.Buffer
	tee := io.TeeReader(c, &rec)
	if _, err := io.ReadFull(tee, make([]byte, len(clientPreface))); err != nil {
		return false, false, err
	}
	out := append([]byte(nil), rec.Bytes()...)
	fr := http2.NewFramer(c, tee)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.SetMaxReadFrameSize(maxSniffBytes)
	if err := fr.WriteSettings(earlySettings...); err != nil {
		return false, false, err
	}
	for rec.Len() < maxSniffBytes {
		start := rec.Len()
		f, err := fr.ReadFrame()
		if err != nil {
			return false, false, err
		}
		frame := rec.Bytes()[start:]
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() && !acked {
				acked = true
				continue
			}
		case *http2.MetaHeadersFrame:
			out = append(out, frame...)
			ct := ""
			for _, hf := range f.Fields {
				if hf.Name == "content-type" {
					ct = hf.Value
				}
			}
			c.buf = append(out, c.buf...)
			return strings.HasPrefix(ct, "application/grpc"), acked, nil
		}
		out = append(out, frame...)
	}
	return false, false, errors.New("no request headers within the sniffing limit")
}

// settingsAckFilter drops the first SETTINGS acknowledgement from an
// HTTP/2 byte stream that starts with the client preface.
type settingsAckFilter struct {
	r       *bufio.Reader
	skip    int // bytes of the current frame (or preface) still to pass
	started bool
	dropped bool
}

func (f *settingsAckFilter) Read(p []byte) (int, error) {
	if !f.started {
		f.started = true
		f.skip = len(clientPreface)
	}
	for !f.dropped && f.skip == 0 {
		hdr, err := f.r.Peek(9)
		if err != nil {
			return 0, err
		}
		length := int(binary.BigEndian.Uint32(append([]byte{0}, hdr[:3]...)))
		if http2.FrameType(hdr[3]) == http2.FrameSettings && http2.Flags(hdr[4]).Has(http2.FlagSettingsAck) {
			if _, err := f.r.Discard(9 + length); err != nil {
				return 0, err
			}
			f.dropped = true
			break
		}
		f.skip = 9 + length
	}
	if !f.dropped && len(p) > f.skip {
		p = p[:f.skip]
	}
	n, err := f.r.Read(p)
	if !f.dropped {
		f.skip -= n
	}
	return n, err
}

// connListener hands classified connections to a server's Serve loop.
type connListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

// push hands c to the server; it closes c when the listener is closed.
func (l *connListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// sniffCreds are the gRPC server's transport credentials: TLS is already
// terminated by the listener, so the handshake only reports its state.
type sniffCreds struct{}

var _ credentials.TransportCredentials = sniffCreds{}

type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }

func (sniffCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if sc, ok := c.(*sniffedConn); ok && sc.tls != nil {
		return c, credentials.TLSInfo{
			State:          *sc.tls,
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		}, nil
	}
	return c, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (sniffCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server-only credentials")
}

func (sniffCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "openshell-sniffed"}
}

func (sniffCreds) Clone() credentials.TransportCredentials { return sniffCreds{} }

//nolint:staticcheck // required by the interface.
func (sniffCreds) OverrideServerName(string) error { return nil }
