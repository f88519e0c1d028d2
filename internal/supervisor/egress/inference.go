package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// serveInferenceTunnel answers a CONNECT to InferenceHost: the tunnel is
// accepted without a policy decision, TLS (when the client starts it and
// the proxy has a CA) is terminated with a leaf for InferenceHost, and
// every request in the tunnel goes to Config.Inference.
func (p *Proxy) serveInferenceTunnel(c net.Conn, br *bufio.Reader, caller Caller) {
	conn, hello, ok := acceptTunnel(c, br)
	if !ok {
		return
	}
	if hello {
		if p.cfg.CA == nil {
			return
		}
		leaf, err := p.cfg.CA.leaf(InferenceHost)
		if err != nil {
			return
		}
		tc := tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
		_ = tc.SetDeadline(time.Now().Add(headerTimeout))
		if err := tc.Handshake(); err != nil {
			return
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	cr := &capReader{r: conn}
	tbr := bufio.NewReaderSize(cr, bufSize)
	for {
		req, status, _ := readRequest(conn, cr, tbr, httpHeaderLimit)
		if req == nil {
			if status != 0 {
				writeStatus(conn, status, fmt.Sprintf("request headers exceed %d bytes", httpHeaderLimit))
			}
			return
		}
		if !p.cfg.Inference(conn, req, caller) {
			return
		}
	}
}
