package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ServiceRouter serves the HTTP requests of sandbox service hosts
// (internal/api/services.Router). The server authenticates the caller and
// puts the principal in the request context before calling ServeHTTP.
type ServiceRouter interface {
	// IsServiceHost reports whether a Host header names a sandbox service.
	IsServiceHost(host string) bool
	http.Handler
}

// serviceAuthMethod is the RPC whose authorization rule a service request
// must pass: reaching a sandbox's app is a TCP forward into the sandbox.
const serviceAuthMethod = "/openshell.v1.OpenShell/ForwardTcp"

// plaintextServicesOnly reports whether a plaintext request may reach only
// service hosts: the listener requires client certificates, so plaintext
// is there only for the loopback service path.
func (s *Server) plaintextServicesOnly() bool {
	return s.tlsConf != nil && s.tlsConf.ClientAuth == tls.RequireAndVerifyClientCert
}

type connTLSKey struct{}

// withConnTLS records the TLS state of a sniffed connection in ctx: the
// HTTP/1 server sets Request.TLS only for *tls.Conn, which the sniffed
// connections are not.
func withConnTLS(ctx context.Context, c net.Conn) context.Context {
	var sc *sniffedConn
	switch v := c.(type) {
	case *sniffedConn:
		sc = v
	case tlsSniffedConn:
		sc = v.sniffedConn
	}
	if sc == nil || sc.tls == nil {
		return ctx
	}
	return context.WithValue(ctx, connTLSKey{}, sc.tls)
}

// requestTLS returns the TLS state of r's connection, or nil.
func requestTLS(r *http.Request) *tls.ConnectionState {
	if r.TLS != nil {
		return r.TLS
	}
	st, _ := r.Context().Value(connTLSKey{}).(*tls.ConnectionState)
	return st
}

// httpRoot routes a request of the main port: service hosts to the
// service router, everything else to the gateway's HTTP routes. On the
// loopback plaintext path only service hosts are served.
func (s *Server) httpRoot(w http.ResponseWriter, r *http.Request) {
	if sr := s.opts.Services; sr != nil && sr.IsServiceHost(r.Host) {
		s.serveService(w, r, sr)
		return
	}
	if requestTLS(r) == nil && s.plaintextServicesOnly() {
		http.NotFound(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// serveService authenticates a service request and hands it to sr.
func (s *Server) serveService(w http.ResponseWriter, r *http.Request, sr ServiceRouter) {
	state := requestTLS(r)
	plaintextPath := state == nil && s.tlsConf != nil
	if plaintextPath {
		if !s.opts.LoopbackServiceHTTP {
			http.NotFound(w, r)
			return
		}
	}
	login := s.opts.ServiceLogin
	if login != nil && strings.HasPrefix(r.URL.Path, loginPathPrefix) {
		// Before the cross-origin check: the callback is the one request
		// that arrives from the issuer's site, and state + PKCE protect it.
		s.serveLogin(w, r, state != nil)
		return
	}
	if plaintextPath {
		if reason := crossOrigin(r); reason != "" {
			s.log.Info("cross-origin service request rejected", "host", r.Host, "reason", reason)
			serviceError(w, http.StatusForbidden, "Cross-origin service request rejected")
			return
		}
	}
	md := metadata.MD{}
	for k, v := range r.Header {
		md[strings.ToLower(k)] = v
	}
	req := &auth.Request{FullMethod: serviceAuthMethod, Metadata: md}
	if state != nil && len(state.VerifiedChains) > 0 {
		req.PeerCertificates = state.VerifiedChains[0]
	}
	p, err := s.opts.Authenticator.Authenticate(r.Context(), req)
	if err == nil && p == nil && plaintextPath && s.plaintextServicesOnly() {
		// The loopback plaintext path of a local mTLS gateway: browsers
		// there carry no client certificate; the loopback bind is the
		// boundary, as in OpenShell.
		p = auth.LocalDevPrincipal()
	}
	if err == nil && p == nil && login != nil {
		p, err = s.sessionPrincipal(r, state != nil)
		if err == nil && p == nil && isNavigation(r) {
			s.startLogin(w, r, state != nil)
			return
		}
		if p != nil {
			if reason := crossSiteForSession(r, requestOrigin(r, state != nil)); reason != "" {
				s.log.Info("cross-site service request with a session cookie rejected", "host", r.Host, "reason", reason)
				serviceError(w, http.StatusForbidden, "Cross-site service request rejected")
				return
			}
		}
		if lc := cookiesFor(state != nil); errors.Is(err, errdefs.ErrUnauthenticated) {
			lc.set(w, lc.session, "", -1)
		}
	}
	if err == nil {
		err = s.opts.Authorizer.Authorize(serviceAuthMethod, p)
	}
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated):
		serviceError(w, http.StatusUnauthorized, "Authentication required")
		return
	case errors.Is(err, errdefs.ErrPermissionDenied):
		serviceError(w, http.StatusForbidden, "Forbidden")
		return
	case err != nil:
		s.log.Warn("service request authentication", "host", r.Host, "error", err)
		serviceError(w, http.StatusInternalServerError, "Service endpoint is not available")
		return
	}
	if login != nil {
		stripLoginCookies(r)
	}
	sr.ServeHTTP(w, r.WithContext(auth.NewContext(r.Context(), p)))
}

func serviceError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg + "\n"))
}

// crossOrigin returns why a plaintext service request looks like it came
// from another origin (including a sibling service subdomain), or "".
// Fetch Metadata is checked first; Origin and Referer, when present, must
// name the request's own origin.
func crossOrigin(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return "sec-fetch-site " + site
	}
	self := "http://" + strings.ToLower(r.Host)
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, self) {
		return "origin"
	}
	if ref := r.Header.Get("Referer"); ref != "" && !sameOrigin(ref, self) {
		return "referer"
	}
	return ""
}

func sameOrigin(raw, self string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return false
	}
	return strings.ToLower(u.Scheme+"://"+u.Host) == self
}
