package relay_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
)

// relayServerStream is the gateway's end of a RelayStream call, driven by
// the test: it claims channelID, then waits for its context to end.
type relayServerStream struct {
	grpc.ServerStream
	ctx       context.Context
	channelID string
	sentInit  bool
}

func (s *relayServerStream) Context() context.Context { return s.ctx }

func (s *relayServerStream) Recv() (*openshellv1.RelayFrame, error) {
	if !s.sentInit {
		s.sentInit = true
		return &openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Init{Init: &openshellv1.RelayInit{ChannelId: s.channelID}}}, nil
	}
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}

func (s *relayServerStream) Send(*openshellv1.RelayFrame) error { return nil }

// TestRelayStreamLinksRequester: the span of the RelayStream call that
// claims a relay links to the span of the call that opened it (RelayOpen
// carries no trace context); a relay opened without a span adds no link.
func TestRelayStreamLinksRequester(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	gw := relaytest.Start(t, relaytest.Options{})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "inst-1")

	for _, traced := range []bool{true, false} {
		openCtx := t.Context()
		var exec trace.Span
		if traced {
			openCtx, exec = tracer.Start(openCtx, "exec")
		}
		res := openAsync(openCtx, gw.Registry(), "sb-a", relay.SSHTarget())
		ro := sup.nextRelayOpen()
		streamCtx, cancel := context.WithCancel(t.Context())
		streamCtx, relaySpan := tracer.Start(streamCtx, "relay-stream")
		done := make(chan error, 1)
		go func() {
			done <- gw.Registry().HandleRelayStream(&relayServerStream{ctx: streamCtx, channelID: ro.GetChannelId()}, "sb-a")
		}()
		r := <-res
		if r.err != nil {
			t.Fatalf("OpenRelay() = %v", r.err)
		}
		_ = r.conn.Close()
		cancel()
		<-done
		relaySpan.End()
		if exec != nil {
			exec.End()
		}
		ended := rec.Ended()
		var got sdktrace.ReadOnlySpan // this round's: the last one ended
		for _, s := range ended {
			if s.Name() == "relay-stream" {
				got = s
			}
		}
		switch links := got.Links(); {
		case traced:
			var want sdktrace.ReadOnlySpan
			for _, s := range ended {
				if s.Name() == "exec" {
					want = s
				}
			}
			if len(links) != 1 || links[0].SpanContext.SpanID() != want.SpanContext().SpanID() || links[0].SpanContext.TraceID() != want.SpanContext().TraceID() {
				t.Errorf("RelayStream span links = %v, want the opening span %v", links, want.SpanContext())
			}
		case len(links) != 0:
			t.Errorf("RelayStream span of an untraced relay links %v, want none", links)
		}
	}
}
