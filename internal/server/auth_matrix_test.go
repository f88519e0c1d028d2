package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/openshell-go/openshell/internal/auth"
)

// identity is one kind of caller of the matrix, with what the authorizer
// should know about it.
type identity struct {
	name    string
	server  string // "strict" or "allow" (allow_unauthenticated_users)
	tls     *tls.Config
	token   string
	anon    bool
	sandbox bool
	oidc    bool
	roles   []string
	scopes  []string
}

// expectAuth is the authorization rule of the reference, written out
// independently of the authorizer: it returns the code and message of an
// auth rejection, or codes.OK when the call must reach the handler.
func expectAuth(r auth.Rule, id identity, opts auth.AuthorizerOptions) (codes.Code, string) {
	switch r.Mode {
	case "unauthenticated":
		return codes.OK, ""
	case "bearer", "sandbox", "dual":
	default:
		return codes.PermissionDenied, "method has no authorization rule"
	}
	if id.anon {
		return codes.Unauthenticated, "missing authorization header"
	}
	if r.Mode == "sandbox" {
		if !id.sandbox {
			return codes.PermissionDenied, "this method requires a sandbox principal"
		}
		return codes.OK, ""
	}
	if id.sandbox {
		if r.Mode == "bearer" {
			return codes.PermissionDenied, "sandbox principals may not call this method"
		}
		return codes.OK, ""
	}
	if !opts.OIDC {
		return codes.OK, ""
	}
	if r.GlobalRole != "" && !slices.Contains(id.roles, opts.AdminRole) {
		return codes.PermissionDenied, fmt.Sprintf("role '%s' required", opts.AdminRole)
	}
	if r.GlobalRole == "" && r.WorkspaceRole != "" && !slices.Contains(id.roles, opts.UserRole) && !slices.Contains(id.roles, opts.AdminRole) {
		return codes.PermissionDenied, fmt.Sprintf("role '%s' required", opts.UserRole)
	}
	if opts.Scopes && id.oidc && r.Scope != "" && !slices.Contains(id.scopes, "openshell:all") && !slices.Contains(id.scopes, r.Scope) {
		return codes.PermissionDenied, fmt.Sprintf("scope '%s' required", r.Scope)
	}
	return codes.OK, ""
}

// invoke calls method with an empty request of its input type, unary or
// streaming, and returns the call's status.
func invoke(ctx context.Context, cc *grpc.ClientConn, md protoreflect.MethodDescriptor, fullMethod string) error {
	in := dynamicpb.NewMessage(md.Input())
	out := dynamicpb.NewMessage(md.Output())
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		return cc.Invoke(ctx, fullMethod, in, out)
	}
	desc := &grpc.StreamDesc{ClientStreams: md.IsStreamingClient(), ServerStreams: md.IsStreamingServer()}
	st, err := cc.NewStream(ctx, desc, fullMethod)
	if err != nil {
		return err
	}
	if err := st.SendMsg(in); err != nil && err.Error() != "EOF" {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(out)
}

func TestAuthMatrix(t *testing.T) {
	f := newFixture(t)
	_, strictAddr := startServer(t, f.fullOptions(t, false))
	_, allowAddr := startServer(t, f.fullOptions(t, true))

	ownJWT, _, err := f.issuer.Mint("sb-own")
	if err != nil {
		t.Fatal(err)
	}
	otherJWT, _, err := f.issuer.Mint("sb-other")
	if err != nil {
		t.Fatal(err)
	}
	noCert := f.clientTLS()
	ids := []identity{
		{name: "anonymous", server: "strict", tls: noCert, anon: true},
		{name: "local-dev", server: "allow", tls: noCert, roles: []string{auth.DefaultUserRole, auth.DefaultAdminRole}, scopes: []string{"openshell:all"}},
		{name: "mtls-user", server: "strict", tls: f.clientTLS(f.userCert), roles: []string{"openshell-user"}},
		{name: "oidc-with-role", server: "strict", tls: noCert, oidc: true,
			token:  f.oidc.token(t, "bob", []string{auth.DefaultUserRole}, "sandbox:read sandbox:write provider:read config:read"),
			roles:  []string{auth.DefaultUserRole},
			scopes: []string{"sandbox:read", "sandbox:write", "provider:read", "config:read"}},
		{name: "oidc-admin-all", server: "strict", tls: noCert, oidc: true,
			token: f.oidc.token(t, "root", []string{auth.DefaultAdminRole}, "openshell:all"),
			roles: []string{auth.DefaultAdminRole}, scopes: []string{"openshell:all"}},
		{name: "oidc-without-role", server: "strict", tls: noCert, oidc: true,
			token: f.oidc.token(t, "eve", []string{"other"}, "openshell:all"), roles: []string{"other"}, scopes: []string{"openshell:all"}},
		{name: "own-sandbox-jwt", server: "strict", tls: noCert, sandbox: true, token: ownJWT},
		{name: "other-sandbox-jwt", server: "strict", tls: noCert, sandbox: true, token: otherJWT},
	}

	var methods []protoreflect.MethodDescriptor
	var names []string
	for _, svc := range auth.DefaultServices {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(svc)
		if err != nil {
			t.Fatal(err)
		}
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range ms.Len() {
			methods = append(methods, ms.Get(i))
			names = append(names, "/"+string(svc)+"/"+string(ms.Get(i).Name()))
		}
	}
	if len(methods) < 70 {
		t.Fatalf("found %d methods in the descriptors, want every RPC of OpenShell and Inference", len(methods))
	}
	authz, err := auth.NewAuthorizer(f.authorizerOpts)
	if err != nil {
		t.Fatal(err)
	}

	for _, id := range ids {
		t.Run(id.name, func(t *testing.T) {
			addr := strictAddr
			if id.server == "allow" {
				addr = allowAddr
			}
			cc := dial(t, addr, id.tls)
			passed := 0
			for i, md := range methods {
				rule, ok := authz.Rule(names[i])
				if !ok {
					t.Errorf("%s has no authorization option", names[i])
					continue
				}
				wantCode, wantMsg := expectAuth(rule, id, f.authorizerOpts)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				if id.token != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+id.token)
				}
				err := invoke(ctx, cc, md, names[i])
				cancel()
				st := status.Convert(err)
				if wantCode != codes.OK {
					if st.Code() != wantCode || st.Message() != wantMsg {
						t.Errorf("%s as %s = %v %q, want %v %q", names[i], id.name, st.Code(), st.Message(), wantCode, wantMsg)
					}
					continue
				}
				passed++
				switch st.Code() {
				case codes.Unauthenticated, codes.PermissionDenied:
					t.Errorf("%s as %s = %v %q, want the call to pass authorization", names[i], id.name, st.Code(), st.Message())
				case codes.Unavailable, codes.DeadlineExceeded, codes.Internal:
					t.Errorf("%s as %s = %v %q, want a handler answer", names[i], id.name, st.Code(), st.Message())
				}
				if strings.HasSuffix(names[i], "/Health") && st.Code() != codes.OK {
					t.Errorf("Health as %s = %v, want OK", id.name, st.Code())
				}
			}
			t.Logf("%s: %d of %d RPCs pass authorization", id.name, passed, len(methods))
		})
	}
}
