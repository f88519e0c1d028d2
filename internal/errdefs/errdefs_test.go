package errdefs

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code
		wantMsg  string
	}{
		{"wrapped not found", fmt.Errorf("sandbox %q: %w", "foo", ErrNotFound), codes.NotFound, `sandbox "foo"`},
		{"exact text", FailedPrecondition("sandbox is not ready"), codes.FailedPrecondition, "sandbox is not ready"},
		{"conflict is aborted", fmt.Errorf("object x: %w", ErrConflict), codes.Aborted, "object x"},
		{"exact text wrapped keeps kind", fmt.Errorf("create: %w", InvalidArgument("name is required")), codes.InvalidArgument, "create: name is required"},
		{"unknown is internal", io.ErrUnexpectedEOF, codes.Internal, "internal error"},
		{"status passes", status.Error(codes.Unauthenticated, "missing authorization header"), codes.Unauthenticated, "missing authorization header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := ToGRPC(tt.err)
			s, _ := status.FromError(g)
			if s.Code() != tt.wantCode || s.Message() != tt.wantMsg {
				t.Fatalf("ToGRPC(%v) = %v %q, want %v %q", tt.err, s.Code(), s.Message(), tt.wantCode, tt.wantMsg)
			}
			back := FromGRPC(g)
			if tt.wantCode != codes.Internal && Code(back) != tt.wantCode {
				t.Fatalf("Code(FromGRPC) = %v, want %v", Code(back), tt.wantCode)
			}
		})
	}
}

func TestIs(t *testing.T) {
	err := FromGRPC(status.Error(codes.NotFound, "sandbox \"x\" not found"))
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("errors.Is(%v, ErrNotFound) = false", err)
	}
	if err.Error() != "sandbox \"x\" not found" {
		t.Fatalf("message = %q", err.Error())
	}
	if Code(nil) != codes.OK || ToGRPC(nil) != nil {
		t.Fatal("nil must map to OK")
	}
}
