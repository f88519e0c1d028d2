package cli

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// envTraceContext returns the W3C trace context named by TRACEPARENT (and
// TRACESTATE) in the environment, as the gateway's gRPC metadata keys, or
// nil when TRACEPARENT is unset or not a valid traceparent. The CLI has
// no tracer of its own: it only passes a CI pipeline's trace on, so the
// gateway's request span becomes that trace's child (as OpenShell's CLI
// does with TRACEPARENT/TRACESTATE).
func envTraceContext(getenv func(string) string) metadata.MD {
	tp := getenv("TRACEPARENT")
	if tp == "" {
		return nil
	}
	prop := propagation.TraceContext{}
	ctx := prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp, "tracestate": getenv("TRACESTATE")})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	out := propagation.MapCarrier{}
	prop.Inject(ctx, out)
	md := metadata.MD{}
	for _, k := range out.Keys() {
		md.Set(k, out.Get(k))
	}
	return md
}

// traceContextInterceptors add md to every call's outgoing metadata.
func traceContextInterceptors(md metadata.MD) []grpc.DialOption {
	with := func(ctx context.Context) context.Context {
		return metadata.NewOutgoingContext(ctx, metadata.Join(md, outgoing(ctx)))
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(with(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(with(ctx), desc, cc, method, opts...)
		}),
	}
}

func outgoing(ctx context.Context) metadata.MD {
	md, _ := metadata.FromOutgoingContext(ctx)
	return md
}
