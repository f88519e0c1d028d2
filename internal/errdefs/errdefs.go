// Package errdefs defines the closed set of error kinds the gateway, the
// supervisor and the CLI share, and their one mapping to and from gRPC status
// codes.
//
// Callers wrap a kind with context, e.g.
//
//	fmt.Errorf("sandbox %q: %w", name, errdefs.ErrNotFound)
//
// and test with errors.Is. Conversion to a gRPC status happens once, in the
// server's interceptor (ToGRPC); client adapters convert back with FromGRPC.
package errdefs

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kinds. Each maps to exactly one gRPC code.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrConflict           = errors.New("conflict")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnimplemented      = errors.New("unimplemented")
)

var kindCodes = []struct {
	kind error
	code codes.Code
}{
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrConflict, codes.Aborted},
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrUnavailable, codes.Unavailable},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrUnimplemented, codes.Unimplemented},
}

// kindError carries a caller-facing message together with its kind, so that
// the message reaches the client without the kind's generic suffix.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// New returns an error of the given kind whose message is exactly msg.
// Use it where the wire text must match a documented error string.
func New(kind error, msg string) error { return &kindError{kind: kind, msg: msg} }

// NotFound, InvalidArgument, ... are shorthands for New with that kind.
func NotFound(msg string) error           { return New(ErrNotFound, msg) }
func AlreadyExists(msg string) error      { return New(ErrAlreadyExists, msg) }
func Conflict(msg string) error           { return New(ErrConflict, msg) }
func InvalidArgument(msg string) error    { return New(ErrInvalidArgument, msg) }
func FailedPrecondition(msg string) error { return New(ErrFailedPrecondition, msg) }
func PermissionDenied(msg string) error   { return New(ErrPermissionDenied, msg) }
func Unauthenticated(msg string) error    { return New(ErrUnauthenticated, msg) }
func Unavailable(msg string) error        { return New(ErrUnavailable, msg) }
func ResourceExhausted(msg string) error  { return New(ErrResourceExhausted, msg) }
func Unimplemented(msg string) error      { return New(ErrUnimplemented, msg) }

// Code returns the gRPC code for err: the code of its kind, the code of a
// gRPC status it already carries, Canceled/DeadlineExceeded for context
// errors, and Internal for anything else.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return kc.code
		}
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Internal
}

// ToGRPC converts err into a gRPC status error. Errors of a known kind keep
// their message; a kind's own generic suffix (": not found") is trimmed so
// messages read naturally. Unknown errors become Internal with a generic
// message: the caller never sees internal details, the server logs them.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := Code(err)
	switch code {
	case codes.Internal:
		return status.Error(codes.Internal, "internal error")
	case codes.Canceled, codes.DeadlineExceeded:
		return status.Error(code, err.Error())
	}
	return status.Error(code, message(err))
}

func message(err error) string {
	var ke *kindError
	if errors.As(err, &ke) && ke.msg == err.Error() {
		return ke.msg
	}
	msg := err.Error()
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			if trimmed, ok := strings.CutSuffix(msg, ": "+kc.kind.Error()); ok && trimmed != "" {
				return trimmed
			}
		}
	}
	return msg
}

// FromGRPC converts a gRPC status error back into an error of the matching
// kind whose message is the status message. Other errors pass through.
func FromGRPC(err error) error {
	s, ok := status.FromError(err)
	if !ok || s.Code() == codes.OK {
		return err
	}
	for _, kc := range kindCodes {
		if kc.code == s.Code() {
			return New(kc.kind, s.Message())
		}
	}
	return err
}
