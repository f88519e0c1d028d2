package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// Defaults of Options.
const (
	DefaultMaxRecvMsgSize    = 1 << 20
	DefaultKeepaliveInterval = 20 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultSniffTimeout      = 10 * time.Second
	DefaultDrainTimeout      = 10 * time.Second
)

// RateLimit admits Requests gRPC calls per Window; zero values turn it off.
type RateLimit struct {
	Requests int
	Window   time.Duration
}

// Options configure a Server. Zero values take the defaults above.
type Options struct {
	Logger *slog.Logger
	// TLSConfig enables TLS on the main port (plaintext clients are still
	// accepted unless ClientAuth is tls.RequireAndVerifyClientCert). Set
	// ClientCAs and ClientAuth (VerifyClientCertIfGiven or
	// RequireAndVerifyClientCert) for client certificates.
	TLSConfig *tls.Config
	// Authenticator yields the caller's principal; nil = an empty
	// auth.Chain, i.e. every caller is the local development user.
	Authenticator auth.Authenticator
	// Authorizer holds the per-RPC rules; nil = rules from the descriptors
	// without role checks.
	Authorizer *auth.Authorizer
	RateLimit  RateLimit
	// MaxRecvMsgSize bounds incoming gRPC messages (ResourceExhausted).
	MaxRecvMsgSize int
	// KeepaliveInterval / KeepaliveTimeout: HTTP/2 pings to idle clients.
	KeepaliveInterval time.Duration
	KeepaliveTimeout  time.Duration
	// SniffTimeout bounds the TLS handshake and protocol detection.
	SniffTimeout time.Duration
	// DrainTimeout bounds the graceful drain when Serve's ctx ends.
	DrainTimeout time.Duration
	// Ready reports why the gateway cannot serve (still starting, store or
	// compute driver not answering), or nil when it can; nil = always
	// ready. /readyz answers 503 with the reason. The reason is shown to
	// unauthenticated probes: it must not carry connection details.
	Ready func(ctx context.Context) error
	// JWKS returns the sandbox-token verification keys as a JSON Web Key
	// Set; nil = /.well-known/jwks.json answers 404.
	JWKS func() ([]byte, error)
	// Discovery returns the OIDC-shaped discovery document for the given
	// base URL (scheme://authority of the request); nil =
	// /.well-known/openid-configuration answers 404.
	Discovery func(baseURL string) ([]byte, error)
	// HealthListener serves /health, /healthz and /readyz; optional.
	HealthListener net.Listener
	// MetricsListener serves /metrics; optional.
	MetricsListener net.Listener
	// CallbackListener (a Unix socket for local drivers) serves only
	// sandbox and dual RPCs; optional.
	CallbackListener net.Listener
	// Services serves sandbox service hosts (Host: <sandbox>--<service>.<domain>)
	// on the main port; nil = none.
	Services ServiceRouter
	// LoopbackServiceHTTP accepts plaintext HTTP for service hosts only,
	// on a TLS listener that requires client certificates (the gateway
	// sets it only when bound to loopback). Plaintext gRPC and every
	// other HTTP route stay refused there.
	LoopbackServiceHTTP bool
	// ServiceLogin, when set, lets browsers without another identity log
	// in to service hosts with OIDC and keeps them in a session cookie.
	ServiceLogin ServiceLogin
	// Registry receives the metrics; nil = a new registry.
	Registry *prometheus.Registry
	// SecurityEvents receives one security event per security-relevant
	// RPC (internal/securityevent); nil = none.
	SecurityEvents securityevent.Emitter
	// TracerProvider makes a span per RPC (internal/telemetry), continuing
	// the caller's W3C trace context; nil = no spans.
	TracerProvider trace.TracerProvider
	Deps           Deps

	// RequestInterceptor runs after authentication and authorization and
	// before the handler of every unary RPC (internal/interceptor); nil = none.
	RequestInterceptor grpc.UnaryServerInterceptor
}

// Server is the gateway's front. Serve and Shutdown may be called from
// different goroutines; Serve is called once.
type Server struct {
	opts     Options
	log      *slog.Logger
	tlsConf  *tls.Config
	metrics  *metrics
	grpc     *grpc.Server
	callback *grpc.Server
	health   *health.Server
	mux      *http.ServeMux
	http1    *http.Server
	h2       *http2.Server //nolint:staticcheck // SA1019: per-connection ServeConn on sniffed conns has no net/http equivalent
	aux      []*http.Server
	draining atomic.Bool

	mu        sync.Mutex
	listeners []net.Listener
	h2conns   map[net.Conn]struct{}
	grpcLn    *connListener
	httpLn    *connListener
	wg        sync.WaitGroup
	shutdown  sync.Once
	stopped   chan struct{}
	serving   bool
}

// New builds a server from opts; it does not listen yet.
func New(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	log := opts.Logger.With("component", "server")
	if opts.MaxRecvMsgSize == 0 {
		opts.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if opts.KeepaliveInterval == 0 {
		opts.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if opts.KeepaliveTimeout == 0 {
		opts.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if opts.SniffTimeout == 0 {
		opts.SniffTimeout = DefaultSniffTimeout
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.Authenticator == nil {
		opts.Authenticator = auth.NewChain(auth.ChainOptions{})
	}
	if opts.Authorizer == nil {
		a, err := auth.NewAuthorizer(auth.AuthorizerOptions{})
		if err != nil {
			return nil, err
		}
		opts.Authorizer = a
	}
	if (opts.RateLimit.Requests > 0) != (opts.RateLimit.Window > 0) {
		return nil, errors.New("rate limit needs both requests and window")
	}
	if opts.Deps.Logger == nil {
		opts.Deps.Logger = log
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	s := &Server{
		opts:    opts,
		log:     log,
		metrics: m,
		health:  health.NewServer(),
		h2conns: make(map[net.Conn]struct{}),
		stopped: make(chan struct{}),
	}
	if opts.TLSConfig != nil {
		s.tlsConf = opts.TLSConfig.Clone()
		for _, p := range []string{"h2", "http/1.1"} {
			if !slices.Contains(s.tlsConf.NextProtos, p) {
				s.tlsConf.NextProtos = append(s.tlsConf.NextProtos, p)
			}
		}
	}
	var limiter *rateLimiter
	if opts.RateLimit.Requests > 0 {
		limiter = &rateLimiter{limit: opts.RateLimit.Requests, window: opts.RateLimit.Window, now: time.Now}
	}
	var tracer trace.Tracer
	if opts.TracerProvider != nil {
		tracer = opts.TracerProvider.Tracer("github.com/openshell-go/openshell/internal/server")
	}
	newPipeline := func(callbackOnly bool) *pipeline {
		return &pipeline{log: log, authn: opts.Authenticator, authz: opts.Authorizer, limiter: limiter, metrics: m, events: opts.SecurityEvents, tracer: tracer, callbackOnly: callbackOnly}
	}
	svc := NewOpenShellService(opts.Deps)
	var inf inferencev1.InferenceServer = &InferenceService{deps: svc.deps}
	if opts.Deps.Inference != nil {
		inf = opts.Deps.Inference
	}
	newGRPC := func(p *pipeline) *grpc.Server {
		g := grpc.NewServer(
			grpc.Creds(sniffCreds{}),
			grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.KeepaliveInterval, Timeout: opts.KeepaliveTimeout}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: opts.KeepaliveTimeout, PermitWithoutStream: true}),
			grpc.ChainUnaryInterceptor(unaryChain(p, opts.RequestInterceptor)...),
			grpc.ChainStreamInterceptor(p.stream),
		)
		openshellv1.RegisterOpenShellServer(g, svc)
		inferencev1.RegisterInferenceServer(g, inf)
		healthpb.RegisterHealthServer(g, s.health)
		reflection.Register(g)
		return g
	}
	s.grpc = newGRPC(newPipeline(false))
	if opts.CallbackListener != nil {
		s.callback = newGRPC(newPipeline(true))
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /healthz", s.handleHealthz)
	s.mux.HandleFunc("GET /readyz", s.handleReadyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /.well-known/jwks.json", s.handleJWKS)
	s.mux.HandleFunc("GET /.well-known/openid-configuration", s.handleDiscovery)
	s.http1 = &http.Server{Handler: http.HandlerFunc(s.httpRoot), ReadHeaderTimeout: opts.SniffTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug), ConnContext: withConnTLS}
	// The default write scheduler (RFC 9218) announces
	// NO_RFC7540_PRIORITIES=1, the value the listener's early SETTINGS
	// frame already sent (earlySettings); keep them in step.
	s.h2 = &http2.Server{ReadIdleTimeout: opts.KeepaliveInterval, PingTimeout: opts.KeepaliveTimeout} //nolint:staticcheck // SA1019: see Server.h2
	return s, nil
}

// Registry returns the Prometheus registry the server reports to.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }

func (s *Server) ready(ctx context.Context) error {
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	if s.opts.Ready == nil {
		return nil
	}
	return s.opts.Ready(ctx)
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.ready(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func (s *Server) handleJWKS(w http.ResponseWriter, _ *http.Request) {
	if s.opts.JWKS == nil {
		http.NotFound(w, nil)
		return
	}
	b, err := s.opts.JWKS()
	if err != nil {
		s.log.Error("jwks", "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

// handleDiscovery serves the OIDC-shaped discovery document extensions
// use to find the JWKS. Like the JWKS it is public (no credentials are
// checked) and names only public information. jwks_uri must be absolute:
// without a Host (or :authority) the request is refused rather than
// answered with a URI a verifier could resolve against the wrong origin.
func (s *Server) handleDiscovery(w http.ResponseWriter, r *http.Request) {
	if s.opts.Discovery == nil {
		http.NotFound(w, r)
		return
	}
	base := requestBaseURL(r)
	if base == "" {
		http.Error(w, "discovery needs a Host header", http.StatusBadRequest)
		return
	}
	b, err := s.opts.Discovery(base)
	if err != nil {
		s.log.Error("openid-configuration", "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	// jwks_uri is built from these request headers.
	w.Header().Set("Vary", "Host, X-Forwarded-Proto")
	_, _ = w.Write(b)
}

// requestBaseURL is scheme://authority of r as the client addressed it, or
// "". The authority is the Host header (HTTP/2's :authority). The scheme is
// the first X-Forwarded-Proto value when it is http or https (a
// TLS-terminating proxy in front), else that of the connection.
func requestBaseURL(r *http.Request) string {
	if r.Host == "" || strings.ContainsAny(r.Host, "/?#@ ") {
		return ""
	}
	scheme := "http"
	if requestTLS(r) != nil {
		scheme = "https"
	}
	if xf, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); strings.TrimSpace(xf) == "http" || strings.TrimSpace(xf) == "https" {
		scheme = strings.TrimSpace(xf)
	}
	return scheme + "://" + r.Host
}

// Serve accepts connections on ln (and on the optional listeners of
// Options) until ctx ends or Shutdown is called. When ctx ends, Serve
// drains for Options.DrainTimeout. It returns after every connection
// goroutine has ended; the error is nil after a shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.serving || s.draining.Load() {
		s.mu.Unlock()
		return errors.New("server: Serve called twice or after Shutdown")
	}
	s.serving = true
	s.grpcLn = newConnListener(ln.Addr())
	s.httpLn = newConnListener(ln.Addr())
	s.listeners = append(s.listeners, ln)
	s.wg.Go(func() { _ = s.grpc.Serve(s.grpcLn) })
	s.wg.Go(func() { _ = s.http1.Serve(s.httpLn) })
	if l := s.opts.CallbackListener; l != nil {
		s.listeners = append(s.listeners, l)
		s.wg.Go(func() { _ = s.callback.Serve(l) })
	}
	if l := s.opts.HealthListener; l != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /health", s.handleHealthz)
		mux.HandleFunc("GET /healthz", s.handleHealthz)
		mux.HandleFunc("GET /readyz", s.handleReadyz)
		s.serveAux(l, mux)
	}
	if l := s.opts.MetricsListener; l != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
		s.serveAux(l, mux)
	}
	s.mu.Unlock()

	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		s.acceptLoop(ctx, ln)
	}()
	select {
	case <-ctx.Done():
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.DrainTimeout)
		_ = s.Shutdown(dctx)
		cancel()
	case <-s.stopped:
	}
	<-acceptDone
	s.wg.Wait()
	return nil
}

// serveAux starts an extra HTTP server; called with s.mu held.
func (s *Server) serveAux(l net.Listener, h http.Handler) {
	// Plaintext listeners: HTTP/1.1 and HTTP/2 with prior knowledge (h2c).
	protos := &http.Protocols{}
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: s.opts.SniffTimeout, Protocols: protos}
	s.aux = append(s.aux, srv)
	s.listeners = append(s.listeners, l)
	s.wg.Go(func() { _ = srv.Serve(l) })
}

func (s *Server) acceptLoop(ctx context.Context, ln net.Listener) {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.draining.Load() {
				return
			}
			// Temporary failures (EMFILE, ...): back off, capped.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "error", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-s.stopped:
				return
			}
			continue
		}
		delay = 0
		s.wg.Go(func() { s.handleConn(ctx, c) })
	}
}

func (s *Server) handleConn(ctx context.Context, raw net.Conn) {
	kind, c, err := classify(ctx, raw, s.tlsConf, s.opts.SniffTimeout, s.opts.LoopbackServiceHTTP)
	if err != nil {
		s.log.Debug("connection refused", "remote", raw.RemoteAddr().String(), "error", err)
		_ = raw.Close()
		return
	}
	switch kind {
	case kindGRPC:
		s.grpcLn.push(c)
	case kindHTTP1:
		s.httpLn.push(c)
	case kindHTTP2:
		s.mu.Lock()
		if s.draining.Load() {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.h2conns[c] = struct{}{}
		s.mu.Unlock()
		s.h2.ServeConn(c, &http2.ServeConnOpts{Context: withConnTLS(ctx, c), Handler: s.http1.Handler, BaseConfig: s.http1}) //nolint:staticcheck // SA1019: serves one already-classified (h2c or TLS) conn; net/http has no per-conn API
		s.mu.Lock()
		delete(s.h2conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}
}

// Shutdown makes the server not-ready, stops accepting, drains in-flight
// RPCs and HTTP requests until ctx ends, then stops hard (long streams
// such as supervisor sessions end there). It is safe to call more than
// once; later calls return immediately.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdown.Do(func() {
		s.draining.Store(true)
		s.health.Shutdown()
		s.mu.Lock()
		for _, l := range s.listeners {
			_ = l.Close()
		}
		for c := range s.h2conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		var wg sync.WaitGroup
		for _, g := range []*grpc.Server{s.grpc, s.callback} {
			if g == nil {
				continue
			}
			wg.Go(func() {
				done := make(chan struct{})
				go func() { g.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-ctx.Done():
					g.Stop()
					<-done
				}
			})
		}
		for _, h := range append([]*http.Server{s.http1}, s.aux...) {
			wg.Go(func() {
				if err := h.Shutdown(ctx); err != nil {
					_ = h.Close()
				}
			})
		}
		wg.Wait()
		if s.grpcLn != nil {
			_ = s.grpcLn.Close()
			_ = s.httpLn.Close()
		}
		close(s.stopped)
	})
	return nil
}

// unaryChain is the gateway pipeline, then the optional request interceptor.
func unaryChain(p *pipeline, after grpc.UnaryServerInterceptor) []grpc.UnaryServerInterceptor {
	if after == nil {
		return []grpc.UnaryServerInterceptor{p.unary}
	}
	return []grpc.UnaryServerInterceptor{p.unary, after}
}
