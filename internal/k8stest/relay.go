package k8stest

import (
	"io"
	"net"
	"sync"
)

// Relay copies TCP connections accepted on one address to a target picked
// at each connection. Node mode uses it to give pods the apiserver (which
// listens on loopback) at the kubernetes Service's address, with no
// kube-proxy; tests use it to give pods a server that listens on loopback.
type Relay struct {
	l      net.Listener
	target func() (string, error)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewRelay listens on listen ("10.1.2.1:0") and relays each connection to
// the address target returns for it; a connection whose target cannot be
// found or dialled is closed.
func NewRelay(listen string, target func() (string, error)) (*Relay, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	r := &Relay{l: l, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Addr is the address the relay listens on.
func (r *Relay) Addr() string { return r.l.Addr().String() }

// Close stops accepting, closes the relayed connections and waits for their
// copies to end.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	_ = r.l.Close()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) forget(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		delete(r.conns, c)
		_ = c.Close()
	}
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.l.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			addr, err := r.target()
			if err != nil {
				_ = in.Close()
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				return
			}
			if !r.track(in) || !r.track(out) {
				r.forget(in, out)
				return
			}
			done := make(chan struct{})
			go func() {
				copyHalf(out, in)
				close(done)
			}()
			copyHalf(in, out)
			<-done
			r.forget(in, out)
		}()
	}
}

// copyHalf copies src to dst, then half-closes dst's write side.
func copyHalf(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
