package securityevent

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

type recorder struct{ evs []Event }

func (r *recorder) Emit(_ context.Context, ev Event) { r.evs = append(r.evs, ev) }

// TestEveryListedRPCExists: each table entry names a real RPC of the
// service, and every entry yields exactly one event of its class, also
// with no request captured (a stream that failed before its first message).
func TestEveryListedRPCExists(t *testing.T) {
	sd := openshellv1.File_openshell_v1_openshell_proto.Services().ByName("OpenShell")
	for method, sp := range rpcs {
		name := strings.TrimPrefix(method, svc)
		md := sd.Methods().ByName(protoreflect.Name(name))
		if md == nil {
			t.Errorf("%s is not an RPC of openshell.v1.OpenShell", method)
			continue
		}
		for _, req := range []any{nil, newMessage(t, md.Input())} {
			var r recorder
			ObserveRPC(t.Context(), &r, Call{Method: method, Req: req, Code: codes.OK})
			if len(r.evs) != 1 || (r.evs[0].Class != sp.class && method != svc+"ForwardTcp") || r.evs[0].Outcome != Success {
				t.Errorf("ObserveRPC(%s, %T) = %+v, want one %v success event", method, req, r.evs, sp.class)
			}
		}
	}
}

// newMessage returns the generated Go type of desc, empty.
func newMessage(t *testing.T, desc protoreflect.MessageDescriptor) any {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(desc.FullName())
	if err != nil {
		return dynamicpb.NewMessage(desc)
	}
	return mt.New().Interface()
}

func TestRefusalsAndDenials(t *testing.T) {
	for _, tt := range []struct {
		name    string
		call    Call
		class   Class
		none    bool
		message string
	}{
		{"unauthenticated at admission", Call{Method: svc + "CreateSandbox", Code: codes.Unauthenticated, Refused: true}, HTTPActivity, false, "authentication failed for CreateSandbox"},
		{"denied at admission", Call{Method: svc + "CreateSandbox", Code: codes.PermissionDenied, Refused: true}, HTTPActivity, false, "authorization denied for CreateSandbox"},
		{"rate limited", Call{Method: svc + "GetSandbox", Code: codes.ResourceExhausted, Refused: true}, DetectionFinding, false, "rate limit exceeded"},
		{"denied by an unlisted handler", Call{Method: svc + "GetSandbox", Code: codes.PermissionDenied}, HTTPActivity, false, "authorization denied for GetSandbox"},
		{"listed handler denied", Call{Method: svc + "DeleteSandbox", Code: codes.PermissionDenied}, ProcessActivity, false, "sandbox delete: denied"},
		{"listed handler failed", Call{Method: svc + "DeleteSandbox", Code: codes.NotFound}, ProcessActivity, false, "sandbox delete: failure"},
		{"unlisted success", Call{Method: svc + "GetSandbox", Code: codes.OK}, 0, true, ""},
		{"unlisted not found", Call{Method: svc + "GetSandbox", Code: codes.NotFound}, 0, true, ""},
		{"unlisted resource exhausted from a handler", Call{Method: svc + "GetSandbox", Code: codes.ResourceExhausted}, 0, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r recorder
			ObserveRPC(t.Context(), &r, tt.call)
			if tt.none {
				if len(r.evs) != 0 {
					t.Errorf("events = %+v, want none", r.evs)
				}
				return
			}
			if len(r.evs) != 1 || r.evs[0].Class != tt.class || r.evs[0].Message != tt.message {
				t.Errorf("events = %+v, want one %v %q", r.evs, tt.class, tt.message)
			}
		})
	}
}
