package egress

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
)

// PolicyLocalHost is the host Config.PolicyLocal serves: the sandbox-local
// policy advisor API (OpenShell's policy.local), plain HTTP on port 80
// only.
const PolicyLocalHost = "policy.local"

// servePolicyLocal answers one absolute-form request for PolicyLocalHost
// (port is the request's) without a policy decision: another port is
// OpenShell's 400 invalid_policy_local_scheme, no Config.PolicyLocal its
// 503; else the hook answers. The connection is closed afterwards, as
// OpenShell's policy.local answers with Connection: close.
func (p *Proxy) servePolicyLocal(c net.Conn, req *http.Request, port uint32, caller Caller) {
	switch {
	case port != 80:
		WriteJSON(c, http.StatusBadRequest, map[string]any{"error": "invalid_policy_local_scheme", "detail": "Use http://policy.local only"})
	case p.cfg.PolicyLocal == nil:
		writeStatus(c, http.StatusServiceUnavailable, "policy.local is not configured")
	default:
		p.cfg.PolicyLocal(c, req, caller)
	}
}

// WriteJSON writes one HTTP/1.1 response with body encoded as JSON and
// Connection: close.
func WriteJSON(c net.Conn, code int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"internal","detail":"cannot encode the response"}`)
	}
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(b), b)
}
