package egress

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
)

// Credentials resolves provider credential placeholders in HTTP requests
// the proxy admitted (package egress/placeholder implements it). Refusals
// are a non-zero HTTP status with the JSON error code and detail to answer
// with; they never name a placeholder, credential key or value.
type Credentials interface {
	// Resolve rewrites the headers, query and path of req, bound for
	// host:port, in place.
	Resolve(req *http.Request, host string, port uint32) (status int, code, detail string)
	// ResolveBody rewrites req's body, for endpoints with
	// request_body_credential_rewrite.
	ResolveBody(req *http.Request, host string, port uint32) (status int, code, detail string)
	// Redact replaces the placeholders in s (a path for an Event).
	Redact(s string) string
}

// resolveCredentials resolves the placeholders of req, admitted by
// decisions for host:port, after its destination and L7 admission. It
// returns false when the request is refused (the answer is written, ev
// emitted as a denial, the connection ends).
func (p *Proxy) resolveCredentials(c net.Conn, req *http.Request, decisions []Decision, host string, port uint32, ev *Event) bool {
	if p.cfg.Credentials == nil {
		return true
	}
	ev.Path = p.cfg.Credentials.Redact(ev.Path)
	status, code, detail := p.cfg.Credentials.Resolve(req, host, port)
	if status == 0 && bodyRewrite(decisions) {
		status, code, detail = p.cfg.Credentials.ResolveBody(req, host, port)
	}
	if status == 0 {
		return true
	}
	ev.Decision, ev.Reason = "deny", code+": "+detail
	if code == FindingCredentialMismatch {
		ev.Finding = FindingCredentialMismatch
	}
	p.emit(ev)
	body, _ := json.Marshal(map[string]string{"error": code, "detail": detail})
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	return false
}

// bodyRewrite reports whether a REST endpoint of decisions opted in to
// request body credential rewrite.
func bodyRewrite(decisions []Decision) bool {
	for _, d := range decisions {
		for _, l := range d.l7 {
			if l.bodyRewrite {
				return true
			}
		}
	}
	return false
}
