package telemetry

import (
	"context"
	"strings"

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

// StartServerSpan starts the server span of an inbound RPC, named for the
// RPC, as the child of the W3C trace context in the incoming metadata (a
// new trace without one), carrying requestID.
func StartServerSpan(ctx context.Context, tracer trace.Tracer, fullMethod, requestID string) (context.Context, trace.Span) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = Propagator.Extract(ctx, MetadataCarrier(md))
	}
	name, attrs := splitMethod(fullMethod)
	attrs = append(attrs, attribute.String(AttrRequestID, requestID))
	ctx = context.WithValue(ctx, requestIDKey{}, requestID)
	return tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
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

// EndServerSpan records err's gRPC status on span and ends it.
func EndServerSpan(span trace.Span, err error) {
	c := status.Code(err)
	span.SetAttributes(attribute.Int(attrCode, int(c)))
	if serverErrorCodes[c] {
		span.SetStatus(otelcodes.Error, c.String())
	}
	span.End()
}

// endClientSpan records err's status on a client span (every non-OK code
// is an error for the caller) and ends it.
func endClientSpan(span trace.Span, err error) {
	c := status.Code(err)
	span.SetAttributes(attribute.Int(attrCode, int(c)))
	if c != codes.OK {
		span.SetStatus(otelcodes.Error, c.String())
	}
	span.End()
}

const clientScope = "github.com/openshell-go/openshell/internal/telemetry"

func startClientSpan(ctx context.Context, fullMethod string) (context.Context, trace.Span) {
	name, attrs := splitMethod(fullMethod)
	ctx, span := otel.Tracer(clientScope).Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
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
