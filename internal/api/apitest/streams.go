package apitest

import (
	"context"
	"io"
	"sync"

	"google.golang.org/grpc"
)

// SendStream is the server side of a server-streaming call for handler
// unit tests: Send delivers to C (blocking until the test reads it or the
// call's context ends). Only Context and Send are served; the embedded
// grpc.ServerStream is nil.
type SendStream[T any] struct {
	grpc.ServerStream
	Ctx context.Context
	C   chan *T
}

// NewSendStream returns a SendStream for a call running under ctx; buffer
// is the capacity of C (0: every Send waits for the test).
func NewSendStream[T any](ctx context.Context, buffer int) *SendStream[T] {
	return &SendStream[T]{Ctx: ctx, C: make(chan *T, buffer)}
}

// Context returns the call's context.
func (s *SendStream[T]) Context() context.Context { return s.Ctx }

// Send delivers m to C.
func (s *SendStream[T]) Send(m *T) error {
	select {
	case s.C <- m:
		return nil
	case <-s.Ctx.Done():
		return s.Ctx.Err()
	}
}

// RecvStream is the server side of a client-streaming call for handler
// unit tests: Recv returns what the test puts into In, io.EOF once In is
// closed, and the context's error once the call ends. Only Context, Recv
// and SendAndClose are served.
type RecvStream[Req, Res any] struct {
	grpc.ServerStream
	Ctx context.Context
	In  chan *Req

	mu  sync.Mutex
	res *Res
}

// NewRecvStream returns a RecvStream for a call running under ctx.
func NewRecvStream[Req, Res any](ctx context.Context) *RecvStream[Req, Res] {
	return &RecvStream[Req, Res]{Ctx: ctx, In: make(chan *Req)}
}

// Context returns the call's context.
func (s *RecvStream[Req, Res]) Context() context.Context { return s.Ctx }

// Recv returns the next request.
func (s *RecvStream[Req, Res]) Recv() (*Req, error) {
	select {
	case m, ok := <-s.In:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-s.Ctx.Done():
		return nil, s.Ctx.Err()
	}
}

// SendAndClose records the response.
func (s *RecvStream[Req, Res]) SendAndClose(m *Res) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.res = m
	return nil
}

// Response returns what the handler sent with SendAndClose, if anything.
func (s *RecvStream[Req, Res]) Response() *Res {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res
}
