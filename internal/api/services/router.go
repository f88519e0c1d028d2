package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/relay"
)

// relayHostSuffix marks the synthetic upstream host names the router's
// transport dials: "<sandbox-id>.relay.invalid:<port>".
const relayHostSuffix = ".relay.invalid"

// Router serves requests whose host names a sandbox service: it checks
// that the caller (the principal the server put in the request context)
// may see the sandbox, then proxies the request over a supervisor relay
// to 127.0.0.1:<target port> inside the sandbox. HTTP/1.1 and HTTP/2
// clients, streamed responses and WebSocket upgrades (HTTP/1.1, and
// HTTP/2 extended CONNECT when the server allows it) pass through. Connections to a sandbox's port are pooled. Close ends them.
type Router struct {
	s     *Service
	log   *slog.Logger
	tr    *http.Transport
	proxy *httputil.ReverseProxy
}

// NewRouter returns the router of s's endpoints.
func NewRouter(s *Service, log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{s: s, log: log.With("component", "api/services")}
	r.tr = &http.Transport{
		DialContext:           r.dial,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
	r.proxy = &httputil.ReverseProxy{
		Rewrite:       rewrite,
		Transport:     r.tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			r.log.Debug("service request failed", "host", req.Host, "error", err)
			if errors.Is(err, context.Canceled) {
				return
			}
			plain(w, http.StatusBadGateway, "Service endpoint is not reachable")
		},
	}
	return r
}

// Close ends pooled upstream connections.
func (r *Router) Close() { r.tr.CloseIdleConnections() }

// Target is what a service host names.
type Target struct {
	Workspace, Sandbox, Service string
}

// ParseHost returns the target named by host (a Host header, port
// allowed) under one of the service domains.
func (r *Router) ParseHost(host string) (Target, bool) {
	return parseHost(host, r.s.o.URLs.Domains)
}

// IsServiceHost reports whether host names a sandbox service.
func (r *Router) IsServiceHost(host string) bool {
	_, ok := r.ParseHost(host)
	return ok
}

func parseHost(host string, domains []string) (Target, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, d := range domains {
		label, ok := strings.CutSuffix(host, "."+d)
		if !ok || label == "" || strings.Contains(label, ".") {
			continue
		}
		parts := strings.Split(label, "--")
		t := Target{Workspace: lifecycle.DefaultWorkspace, Sandbox: parts[0]}
		switch len(parts) {
		case 1:
		case 2:
			if parts[1] == "" {
				return Target{}, false
			}
			t.Service = parts[1]
		case 3:
			if parts[2] == "" || parts[2] == lifecycle.DefaultWorkspace {
				return Target{}, false
			}
			t.Service, t.Workspace = parts[1], parts[2]
		default:
			return Target{}, false
		}
		if ValidateName("sandbox", t.Sandbox, true) != nil || ValidateName("service", t.Service, false) != nil {
			return Target{}, false
		}
		return t, true
	}
	return Target{}, false
}

func plain(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// ServeHTTP proxies one request. The caller's identity must already be in
// the request context (the server authenticates before routing).
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	t, ok := r.ParseHost(req.Host)
	if !ok {
		plain(w, http.StatusNotFound, "Service endpoint not found")
		return
	}
	ep, sb, err := r.resolve(req.Context(), t)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		plain(w, http.StatusNotFound, "Service endpoint not found")
		return
	case errors.Is(err, errdefs.ErrUnauthenticated):
		plain(w, http.StatusUnauthorized, "Authentication required")
		return
	case errors.Is(err, errdefs.ErrPermissionDenied):
		plain(w, http.StatusForbidden, "Forbidden")
		return
	case err != nil:
		r.log.Warn("service routing", "host", req.Host, "error", err)
		plain(w, http.StatusInternalServerError, "Service endpoint is not available")
		return
	}
	if sb.GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		plain(w, http.StatusPreconditionFailed, "Sandbox is not ready")
		return
	}
	if r.s.o.Relay == nil {
		plain(w, http.StatusBadGateway, "Service endpoint is not reachable")
		return
	}
	u := upstream{
		host: sb.GetMetadata().GetId() + relayHostSuffix + ":" + strconv.FormatUint(uint64(ep.GetTargetPort()), 10),
		port: ep.GetTargetPort(),
	}
	if isH2WebSocket(req) {
		r.serveH2WebSocket(w, req, u)
		return
	}
	r.proxy.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), upstreamKey{}, u)))
}

// resolve loads the endpoint of t after the membership check; a refusal
// reads as a missing endpoint.
func (r *Router) resolve(ctx context.Context, t Target) (*openshellv1.ServiceEndpoint, *openshellv1.Sandbox, error) {
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		// Sandbox tokens never open service URLs, not even their own.
		return nil, nil, errdefs.NotFound("service endpoint not found")
	}
	// Membership of the host's workspace first: a refusal there says
	// nothing about which sandboxes exist, so it may read Forbidden.
	if err := r.s.o.Authz.Workspace(ctx, t.Workspace, openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, nil, err
	}
	sb, err := r.s.o.Sandboxes.Get(ctx, t.Workspace, t.Sandbox)
	if err != nil {
		return nil, nil, err
	}
	if err := r.s.o.Authz.SandboxRecord(ctx, sb); err != nil {
		return nil, nil, err
	}
	_, ep, err := r.s.find(ctx, sb, t.Service)
	if err != nil {
		return nil, nil, err
	}
	if !ep.GetDomain() || ep.GetTargetPort() == 0 || ep.GetTargetPort() > 65535 {
		return nil, nil, errdefs.NotFound("service endpoint not available")
	}
	return ep, sb, nil
}

type upstreamKey struct{}

type upstream struct {
	host string
	port uint32
}

// gatewayAuthHeaders carry the caller's gateway credentials; the sandbox's
// app never sees them.
var gatewayAuthHeaders = []string{"Authorization", "Proxy-Authorization", "X-Forwarded-Client-Cert", "X-Ssl-Client-Cert", "X-Client-Cert", "Cf-Access-Jwt-Assertion"}

// rewrite points the outgoing request at the relay address; ReverseProxy
// has already removed hop-by-hop headers (keeping a WebSocket upgrade).
func rewrite(pr *httputil.ProxyRequest) {
	u := pr.In.Context().Value(upstreamKey{}).(upstream)
	pr.Out.URL = &url.URL{Scheme: "http", Host: u.host, Path: pr.In.URL.Path, RawPath: pr.In.URL.RawPath, RawQuery: pr.In.URL.RawQuery}
	pr.Out.Host = "127.0.0.1:" + strconv.FormatUint(uint64(u.port), 10)
	for _, h := range gatewayAuthHeaders {
		pr.Out.Header.Del(h)
	}
	pr.SetXForwarded()
	pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
}

// dial opens a relay to the port named by a synthetic relay address.
func (r *Router) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	id, ok := strings.CutSuffix(host, relayHostSuffix)
	if !ok {
		return nil, fmt.Errorf("service upstream %q is not a relay address", addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, err
	}
	return r.s.o.Relay.OpenRelay(ctx, id, relay.TCPTarget("127.0.0.1", uint32(p)))
}
