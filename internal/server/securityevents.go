package server

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// securityEvent hands a finished RPC to the security event stream (at most
// one event; see securityevent.ObserveRPC). req is the request or, for
// streams, the first message received.
func (p *pipeline) securityEvent(ctx context.Context, method string, pr *auth.Principal, refused bool, req, resp any, err error) {
	if p.events == nil {
		return
	}
	c := securityevent.Call{
		Method: method, RequestID: RequestID(ctx), Req: req, Resp: resp,
		Code: status.Code(err), Refused: refused,
	}
	if pr != nil {
		c.ActorSubject, c.ActorKind, c.ActorSandboxID = pr.Subject, "user", pr.SandboxID
		if pr.IsSandbox() {
			c.ActorKind = "sandbox"
		}
	}
	if pe, ok := peer.FromContext(ctx); ok && pe.Addr != nil {
		if host, _, e := net.SplitHostPort(pe.Addr.String()); e == nil {
			c.SourceIP = host
		}
	}
	securityevent.ObserveRPC(ctx, p.events, c)
}

// firstRecv keeps the first message a stream handler receives, for the
// security event of the stream.
type firstRecv struct {
	grpc.ServerStream
	first any
}

func (f *firstRecv) RecvMsg(m any) error {
	err := f.ServerStream.RecvMsg(m)
	if err == nil && f.first == nil {
		f.first = m
	}
	return err
}
