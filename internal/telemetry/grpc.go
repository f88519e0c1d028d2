package telemetry

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Span attribute keys.
const (
	// AttrRequestID carries the request id the gateway's log lines carry.
	AttrRequestID = "openshell.request_id"
	attrRPCSystem = "rpc.system"
	attrService   = "rpc.service"
	attrMethod    = "rpc.method"
	attrCode      = "rpc.grpc.status_code"
)

// MetadataCarrier adapts gRPC metadata to a TextMapPropagator.
type MetadataCarrier metadata.MD

// Get returns the first value of k.
func (c MetadataCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces k's values with v.
func (c MetadataCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

// Keys lists the keys.
func (c MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// splitMethod turns "/pkg.Service/Method" into its span name
// "pkg.Service/Method" and attributes.
func splitMethod(full string) (name string, attrs []attribute.KeyValue) {
	name = strings.TrimPrefix(full, "/")
	svc, m, ok := strings.Cut(name, "/")
	if !ok {
		return name, []attribute.KeyValue{attribute.String(attrRPCSystem, "grpc")}
	}
	return name, []attribute.KeyValue{
		attribute.String(attrRPCSystem, "grpc"), attribute.String(attrService, svc), attribute.String(attrMethod, m),
	}
}

// rpcMethod is what a span of one RPC method starts with: its name and
// attributes, the status code OK included (EndServerSpan and
// endClientSpan override it only for another code; the SDK keeps a key's
// last value).
type rpcMethod struct {
	name  string
	attrs []attribute.KeyValue
}

// maxRPCMethods bounds the cache of rpcMethods: gRPC calls server
// interceptors only for registered methods and clients call the methods
// of their stubs, so it holds every method in use; past the bound methods
// are computed per call.
const maxRPCMethods = 1024

var (
	rpcMethods    sync.Map // full method → *rpcMethod
	rpcMethodsLen atomic.Int32
	// serverKind and clientKind are allocated once rather than per span.
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
	// spanAttrs holds the per-call attribute slice StartServerSpan hands
	// to SetAttributes (which copies it).
	spanAttrs = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 8); return &s }}
)

func rpcMethodFor(full string) *rpcMethod {
	if m, ok := rpcMethods.Load(full); ok {
		return m.(*rpcMethod)
	}
	name, attrs := splitMethod(full)
	m := &rpcMethod{name: name, attrs: append(attrs, attribute.Int(attrCode, int(codes.OK)))}
	if rpcMethodsLen.Load() < maxRPCMethods {
		if _, loaded := rpcMethods.LoadOrStore(full, m); !loaded {
			rpcMethodsLen.Add(1)
		}
	}
	return m
}

// incomingCarrier reads single W3C headers of the incoming metadata
// without copying all of it (metadata.FromIncomingContext does).
type incomingCarrier struct{ ctx context.Context }

func (c incomingCarrier) Get(k string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (incomingCarrier) Set(string, string) {}

func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	return MetadataCarrier(md).Keys()
}

// StartServerSpan starts the server span of an inbound RPC, named for the
// RPC, as the child of the W3C trace context in the incoming metadata (a
// new trace without one), carrying requestID. Its attributes are set once
// the sampler decided to record the span: a span not sampled costs no
// attributes.
func StartServerSpan(ctx context.Context, tracer trace.Tracer, fullMethod, requestID string) (context.Context, trace.Span) {
	ctx = Propagator.Extract(ctx, incomingCarrier{ctx})
	m := rpcMethodFor(fullMethod)
	ctx = context.WithValue(ctx, requestIDKey{}, requestID)
	ctx, span := tracer.Start(ctx, m.name, serverKind)
	if span.IsRecording() {
		buf := spanAttrs.Get().(*[]attribute.KeyValue)
		attrs := append(append((*buf)[:0], m.attrs...), attribute.String(AttrRequestID, requestID))
		span.SetAttributes(attrs...)
		clear(attrs)
		*buf = attrs[:0]
		spanAttrs.Put(buf)
	}
	return ctx, span
}

type requestIDKey struct{}

// requestIDHeader carries the request id to the servers the gateway calls.
const requestIDHeader = "x-request-id"

// serverErrorCodes are the codes that mark a server span as failed
// (OpenTelemetry's gRPC conventions); the others are the caller's error.
var serverErrorCodes = map[codes.Code]bool{
	codes.Unknown: true, codes.DeadlineExceeded: true, codes.Unimplemented: true,
	codes.Internal: true, codes.Unavailable: true, codes.DataLoss: true,
}

// EndServerSpan records err's gRPC status on span and ends it. The span
// started with status code OK, so a call that succeeded sets nothing.
func EndServerSpan(span trace.Span, err error) {
	if c := status.Code(err); c != codes.OK {
		span.SetAttributes(attribute.Int(attrCode, int(c)))
		if serverErrorCodes[c] {
			span.SetStatus(otelcodes.Error, c.String())
		}
	}
	span.End()
}

// endClientSpan records err's status on a client span (every non-OK code
// is an error for the caller) and ends it.
func endClientSpan(span trace.Span, err error) {
	if c := status.Code(err); c != codes.OK {
		span.SetAttributes(attribute.Int(attrCode, int(c)))
		span.SetStatus(otelcodes.Error, c.String())
	}
	span.End()
}

const clientScope = "github.com/openshell-go/openshell/internal/telemetry"

func startClientSpan(ctx context.Context, fullMethod string) (context.Context, trace.Span) {
	m := rpcMethodFor(fullMethod)
	ctx, span := otel.Tracer(clientScope).Start(ctx, m.name, clientKind)
	span.SetAttributes(m.attrs...) // a no-op when the span is not recorded
	md, ok := metadata.FromOutgoingContext(ctx)
	if ok {
		md = md.Copy()
	} else {
		md = metadata.MD{}
	}
	Propagator.Inject(ctx, MetadataCarrier(md))
	if id, ok := ctx.Value(requestIDKey{}).(string); ok && id != "" && len(md.Get(requestIDHeader)) == 0 {
		md.Set(requestIDHeader, id)
	}
	return metadata.NewOutgoingContext(ctx, md), span
}

// UnaryClientInterceptor makes a client span per call (the global tracer
// provider's) and forwards the W3C trace context in the metadata, and the
// request id of the server span the call is made under (x-request-id).
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, span := startClientSpan(ctx, method)
		err := invoker(ctx, method, req, reply, cc, opts...)
		endClientSpan(span, err)
		return err
	}
}

// StreamClientInterceptor forwards the W3C trace context of a stream and
// spans its opening (the stream's life is not traced).
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, span := startClientSpan(ctx, method)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		endClientSpan(span, err)
		return cs, err
	}
}

// ServerInterceptors continue the W3C trace context of incoming calls with
// a server span per call, for servers other than the gateway's own (e.g.
// `driver serve`); requestID is read from the x-request-id metadata.
func ServerInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	tracer := otel.Tracer(clientScope)
	rid := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(requestIDHeader); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := StartServerSpan(ctx, tracer, info.FullMethod, rid(ctx))
		resp, err := h(ctx, req)
		EndServerSpan(span, err)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := StartServerSpan(ss.Context(), tracer, info.FullMethod, rid(ss.Context()))
		err := h(srv, &ctxStream{ServerStream: ss, ctx: ctx})
		EndServerSpan(span, err)
		return err
	}
	return unary, stream
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
