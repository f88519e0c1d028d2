package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/securityevent"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// RequestIDHeader carries the request id in and out (response header).
const RequestIDHeader = "x-request-id"

type requestIDKey struct{}

// RequestID returns the id of the request ctx belongs to.
func RequestID(ctx context.Context) string {
	s, _ := ctx.Value(requestIDKey{}).(string)
	return s
}

// rateLimiter admits at most limit requests per fixed window.
type rateLimiter struct {
	limit  int
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	start time.Time
	n     int
}

func (r *rateLimiter) allow() bool {
	if r == nil {
		return true
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= r.window {
		r.start, r.n = now, 0
	}
	if r.n >= r.limit {
		return false
	}
	r.n++
	return true
}

// pipeline runs the per-RPC steps shared by the unary and stream
// interceptors of one gRPC server.
type pipeline struct {
	log     *slog.Logger
	authn   auth.Authenticator
	authz   *auth.Authorizer
	limiter *rateLimiter
	metrics *metrics
	// events receives security events; nil = none.
	events securityevent.Emitter
	// tracer makes a span per RPC; nil = none.
	tracer trace.Tracer
	// callbackOnly restricts the server to sandbox and dual RPCs.
	callbackOnly bool
}

// admit assigns the request id, applies the rate limit and authenticates
// and authorizes the caller. It returns the context handlers run with.
func (p *pipeline) admit(ctx context.Context, method string) (context.Context, *auth.Principal, error) {
	if !p.limiter.allow() {
		return ctx, nil, errdefs.ResourceExhausted("rate limit exceeded")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get(auth.AuthSourceHeader)) > 0 {
		md = md.Copy()
		delete(md, auth.AuthSourceHeader)
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	if auth.BypassesAuth(method) {
		return ctx, nil, nil
	}
	rule, ok := p.authz.Rule(method)
	if p.callbackOnly && (!ok || (rule.Mode != auth.ModeSandbox && rule.Mode != auth.ModeDual)) {
		return ctx, nil, errdefs.PermissionDenied("method is not available on the sandbox callback listener")
	}
	if ok && rule.Mode == auth.ModeUnauthenticated {
		return ctx, nil, nil
	}
	req := &auth.Request{FullMethod: method, Metadata: md, PeerCertificates: peerCerts(ctx)}
	pr, err := p.authn.Authenticate(ctx, req)
	if err != nil {
		return ctx, nil, err
	}
	if err := p.authz.Authorize(method, pr); err != nil {
		return ctx, pr, err
	}
	if pr != nil {
		ctx = auth.NewContext(ctx, pr)
	}
	return ctx, pr, nil
}

func peerCerts(ctx context.Context) []*x509.Certificate {
	pe, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := pe.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0]
}

func requestID(ctx context.Context) (context.Context, string) {
	id := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RequestIDHeader); len(v) > 0 && validRequestID(v[0]) {
			id = v[0]
		}
	}
	if id == "" {
		id = uuid.NewString()
	}
	return context.WithValue(ctx, requestIDKey{}, id), id
}

func validRequestID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := range len(s) {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// toStatus converts a handler error to a gRPC status, once. Unknown errors
// become Internal "internal error"; the full error is logged.
func (p *pipeline) toStatus(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	st := errdefs.ToGRPC(err)
	if status.Code(st) == codes.Internal {
		p.log.LogAttrs(ctx, slog.LevelError, "rpc failed", slog.String("method", method),
			slog.String("request_id", RequestID(ctx)), slog.String("error", err.Error()))
	}
	return st
}

func (p *pipeline) recovered(ctx context.Context, method string, r any) error {
	p.log.LogAttrs(ctx, slog.LevelError, "rpc panicked", slog.String("method", method),
		slog.String("request_id", RequestID(ctx)), slog.String("panic", fmt.Sprint(r)),
		slog.String("stack", string(debug.Stack())))
	return status.Error(codes.Internal, "internal error")
}

// done records metrics and writes the access log line: at debug level
// (counts and latency by method and code are in the metrics), at error
// level for Internal and Unknown.
func (p *pipeline) done(ctx context.Context, method string, start time.Time, pr *auth.Principal, err error) {
	d := time.Since(start)
	code := status.Code(err)
	p.metrics.observe(method, code, d)
	level := slog.LevelDebug
	if code == codes.Internal || code == codes.Unknown {
		level = slog.LevelError
	}
	if !p.log.Enabled(ctx, level) {
		return
	}
	subject := ""
	if pr != nil {
		subject = pr.Subject
	}
	p.log.LogAttrs(ctx, level, "rpc", slog.String("method", method), slog.String("code", code.String()),
		slog.Duration("duration", d), slog.String("principal", subject), slog.String("request_id", RequestID(ctx)))
}

func (p *pipeline) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	ctx, id := requestID(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDHeader, id))
	var span trace.Span
	if p.tracer != nil {
		ctx, span = telemetry.StartServerSpan(ctx, p.tracer, info.FullMethod, id)
	}
	var pr *auth.Principal
	refused := false
	defer func() {
		if r := recover(); r != nil {
			resp, err = nil, p.recovered(ctx, info.FullMethod, r)
		}
		p.done(ctx, info.FullMethod, start, pr, err)
		p.securityEvent(ctx, info.FullMethod, pr, refused, req, resp, err)
		if span != nil {
			telemetry.EndServerSpan(span, err)
		}
	}()
	ctx, pr, err = p.admit(ctx, info.FullMethod)
	if err == nil {
		resp, err = handler(ctx, req)
	} else {
		refused = true
	}
	return resp, p.toStatus(ctx, info.FullMethod, err)
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }

func (p *pipeline) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	ctx, id := requestID(ss.Context())
	_ = ss.SetHeader(metadata.Pairs(RequestIDHeader, id))
	var span trace.Span
	if p.tracer != nil {
		ctx, span = telemetry.StartServerSpan(ctx, p.tracer, info.FullMethod, id)
	}
	var pr *auth.Principal
	refused := false
	var first *firstRecv
	defer func() {
		if r := recover(); r != nil {
			err = p.recovered(ctx, info.FullMethod, r)
		}
		p.done(ctx, info.FullMethod, start, pr, err)
		var req any
		if first != nil {
			req = first.first
		}
		p.securityEvent(ctx, info.FullMethod, pr, refused, req, nil, err)
		if span != nil {
			telemetry.EndServerSpan(span, err)
		}
	}()
	ctx, pr, err = p.admit(ctx, info.FullMethod)
	if err == nil {
		s := ss
		if p.events != nil && securityevent.Watches(info.FullMethod) {
			first = &firstRecv{ServerStream: ss}
			s = first
		}
		err = handler(srv, &wrappedStream{ServerStream: s, ctx: ctx})
	} else {
		refused = true
	}
	return p.toStatus(ctx, info.FullMethod, err)
}
