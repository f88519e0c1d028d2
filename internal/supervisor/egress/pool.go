package egress

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Bounds of the idle upstream pool: per destination, overall, and how
// long an idle connection is kept.
const (
	maxIdlePerDest = 4
	maxIdle        = 64
	idleTimeout    = 30 * time.Second
)

type destKey struct {
	host string
	port uint32
}

// upPool keeps idle upstream connections of forwarded http:// requests
// between client connections, by destination host and port. A connection
// is taken only for the same host and port, when the current policy's
// address check still admits the address it reaches, and when it is
// still open and quiet. Safe for concurrent use.
type upPool struct {
	mu   sync.Mutex
	idle map[destKey][]*upConn // most recently used last
	n    int
	now  func() time.Time
}

// put keeps u for reuse; false when the pool is full (the caller closes u).
func (p *upPool) put(u *upConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := destKey{u.host, u.port}
	if p.n >= maxIdle || len(p.idle[k]) >= maxIdlePerDest {
		return false
	}
	if p.idle == nil {
		p.idle = map[destKey][]*upConn{}
	}
	u.idleSince = p.clock()
	p.idle[k] = append(p.idle[k], u)
	p.n++
	return true
}

// take returns an idle connection to host:port that admit accepts, or
// nil. Connections found expired, closed, unexpectedly readable or not
// admitted are handed to drop.
func (p *upPool) take(host string, port uint32, admit func(*upConn) bool, drop func(*upConn)) *upConn {
	k := destKey{host, port}
	for {
		p.mu.Lock()
		list := p.idle[k]
		if len(list) == 0 {
			p.mu.Unlock()
			return nil
		}
		u := list[len(list)-1]
		p.idle[k] = list[:len(list)-1]
		p.n--
		expired := p.clock().Sub(u.idleSince) > idleTimeout
		p.mu.Unlock()
		if !expired && admit(u) && quiet(u) {
			return u
		}
		drop(u)
	}
}

// sweep hands the connections idle longer than idleTimeout to drop.
func (p *upPool) sweep(drop func(*upConn)) {
	var old []*upConn
	p.mu.Lock()
	now := p.clock()
	for k, list := range p.idle {
		kept := list[:0]
		for _, u := range list {
			if now.Sub(u.idleSince) > idleTimeout {
				old = append(old, u)
			} else {
				kept = append(kept, u)
			}
		}
		p.n -= len(list) - len(kept)
		if len(kept) == 0 {
			delete(p.idle, k)
		} else {
			p.idle[k] = kept
		}
	}
	p.mu.Unlock()
	for _, u := range old {
		drop(u)
	}
}

// drain empties the pool, handing every connection to drop.
func (p *upPool) drain(drop func(*upConn)) {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.n = nil, 0
	p.mu.Unlock()
	for _, list := range idle {
		for _, u := range list {
			drop(u)
		}
	}
}

func (p *upPool) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// quiet reports whether idle connection u is still open with nothing to
// read: a read with a deadline already passed must time out (data or an
// end of stream mean the upstream closed or misbehaved).
func quiet(u *upConn) bool {
	if u.br.Buffered() > 0 {
		return false
	}
	if err := u.SetReadDeadline(time.Now()); err != nil {
		return false
	}
	_, err := u.br.Peek(1)
	var ne net.Error
	ok := errors.As(err, &ne) && ne.Timeout()
	return u.SetReadDeadline(time.Time{}) == nil && ok
}

// replayable reports whether req may be sent again after a reused
// upstream connection failed before answering: no body, and a method
// without side effects or an idempotency key (net/http's rule).
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}
