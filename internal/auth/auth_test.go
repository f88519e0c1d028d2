package auth

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/openshell-go/openshell/internal/errdefs"
)

func TestAuthorizerReadsDescriptors(t *testing.T) {
	a, err := NewAuthorizer(AuthorizerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, m := range a.Methods() {
		r, _ := a.Rule(m)
		counts[r.Mode]++
	}
	// The reference: 1 unauthenticated, 9 sandbox-only + GetInferenceBundle,
	// 3 dual; the rest bearer.
	want := map[string]int{ModeUnauthenticated: 1, ModeSandbox: 10, ModeDual: 3, ModeBearer: 58}
	for mode, n := range want {
		if counts[mode] != n {
			t.Errorf("methods with mode %q = %d, want %d (all: %v)", mode, counts[mode], n, counts)
		}
	}
	r, ok := a.Rule("/openshell.v1.OpenShell/GetGatewayInfo")
	if !ok || r != (Rule{Mode: ModeBearer, GlobalRole: "platform_admin", Scope: "config:read"}) {
		t.Errorf("Rule(GetGatewayInfo) = %+v, %v", r, ok)
	}
}

func TestAuthorize(t *testing.T) {
	oidc := AuthorizerOptions{OIDC: true, AdminRole: DefaultAdminRole, UserRole: DefaultUserRole, Scopes: true}
	user := &Principal{Kind: KindUser, Source: SourceOIDC, Subject: "u", Roles: []string{DefaultUserRole}, Scopes: []string{"sandbox:read"}}
	admin := &Principal{Kind: KindUser, Source: SourceOIDC, Subject: "a", Roles: []string{DefaultAdminRole}, Scopes: []string{ScopeAll}}
	sandbox := &Principal{Kind: KindSandbox, Source: SourceSandboxJWT, SandboxID: "s"}
	const (
		getSandbox    = "/openshell.v1.OpenShell/GetSandbox"
		createSandbox = "/openshell.v1.OpenShell/CreateSandbox"
		gatewayInfo   = "/openshell.v1.OpenShell/GetGatewayInfo"
		connect       = "/openshell.v1.OpenShell/ConnectSupervisor"
		config        = "/openshell.v1.OpenShell/GetSandboxConfig"
	)
	tests := []struct {
		name   string
		opts   AuthorizerOptions
		method string
		p      *Principal
		kind   error
		msg    string
	}{
		{"health anonymous", oidc, "/openshell.v1.OpenShell/Health", nil, nil, ""},
		{"grpc health bypass", oidc, "/grpc.health.v1.Health/Check", nil, nil, ""},
		{"unknown method denied", oidc, "/openshell.v1.OpenShell/NoSuchMethod", admin, errdefs.ErrPermissionDenied, "method has no authorization rule"},
		{"anonymous bearer", oidc, getSandbox, nil, errdefs.ErrUnauthenticated, "missing authorization header"},
		{"user on sandbox rpc", oidc, connect, admin, errdefs.ErrPermissionDenied, "this method requires a sandbox principal"},
		{"sandbox on bearer rpc", oidc, getSandbox, sandbox, errdefs.ErrPermissionDenied, "sandbox principals may not call this method"},
		{"sandbox on sandbox rpc", oidc, connect, sandbox, nil, ""},
		{"sandbox on dual rpc", oidc, config, sandbox, nil, ""},
		{"user with scope", oidc, getSandbox, user, nil, ""},
		{"user missing scope", oidc, createSandbox, user, errdefs.ErrPermissionDenied, "scope 'sandbox:write' required"},
		{"user missing admin", oidc, gatewayInfo, user, errdefs.ErrPermissionDenied, "role 'openshell-admin' required"},
		{"admin satisfies workspace role", oidc, createSandbox, admin, nil, ""},
		{"no role", oidc, getSandbox, &Principal{Kind: KindUser, Source: SourceOIDC}, errdefs.ErrPermissionDenied, "role 'openshell-user' required"},
		{"scopes off", AuthorizerOptions{OIDC: true, AdminRole: DefaultAdminRole, UserRole: DefaultUserRole}, createSandbox, user, nil, ""},
		{"no oidc: no role checks", AuthorizerOptions{}, gatewayInfo, &Principal{Kind: KindUser, Source: SourceMTLS}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAuthorizer(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			err = a.Authorize(tc.method, tc.p)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("Authorize() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.kind) || err.Error() != tc.msg {
				t.Errorf("Authorize() = %v, want %v %q", err, tc.kind, tc.msg)
			}
		})
	}
}

func TestChain(t *testing.T) {
	bearerReq := func(method string) *Request {
		return &Request{FullMethod: method, Metadata: metadata.Pairs("authorization", "Bearer tok")}
	}
	user := &Principal{Kind: KindUser, Subject: "user"}
	sb := &Principal{Kind: KindSandbox, Subject: "sb"}
	k8s := &Principal{Kind: KindSandbox, Subject: "k8s", Source: SourceK8sSABootstrap}
	fixed := func(p *Principal, err error) Authenticator {
		return AuthenticatorFunc(func(context.Context, *Request) (*Principal, error) { return p, err })
	}
	denied := errdefs.Unauthenticated("invalid token: nope")
	tests := []struct {
		name    string
		opts    ChainOptions
		req     *Request
		want    *Principal
		wantErr error
	}{
		{"none configured: local dev", ChainOptions{}, bearerReq("/x/Y"), LocalDevPrincipal(), nil},
		{"first match wins", ChainOptions{SandboxJWT: fixed(sb, nil), OIDC: fixed(user, nil)}, bearerReq("/x/Y"), sb, nil},
		{"first error ends", ChainOptions{SandboxJWT: fixed(nil, denied), OIDC: fixed(user, nil)}, bearerReq("/x/Y"), nil, denied},
		{"fall through", ChainOptions{SandboxJWT: fixed(nil, nil), OIDC: fixed(user, nil)}, bearerReq("/x/Y"), user, nil},
		{"k8s only for IssueSandboxToken", ChainOptions{K8sServiceAccount: fixed(k8s, nil), SandboxJWT: fixed(nil, nil), OIDC: fixed(user, nil)}, bearerReq("/x/Y"), user, nil},
		{"k8s on IssueSandboxToken", ChainOptions{K8sServiceAccount: fixed(k8s, nil), OIDC: fixed(user, nil)}, bearerReq(IssueSandboxTokenMethod), k8s, nil},
		{"unrecognized bearer", ChainOptions{SandboxJWT: fixed(nil, nil)}, bearerReq("/x/Y"), nil, errdefs.ErrUnauthenticated},
		{"anonymous", ChainOptions{SandboxJWT: fixed(nil, nil)}, &Request{FullMethod: "/x/Y"}, nil, nil},
		{"allow unauthenticated", ChainOptions{SandboxJWT: fixed(nil, nil), AllowUnauthenticated: true}, &Request{FullMethod: "/x/Y"}, LocalDevPrincipal(), nil},
		{"mtls before local dev", ChainOptions{MTLS: fixed(user, nil), AllowUnauthenticated: true}, &Request{FullMethod: "/x/Y"}, user, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewChain(tc.opts).Authenticate(t.Context(), tc.req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Authenticate() error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && got.Subject != tc.want.Subject) {
				t.Errorf("Authenticate() = %+v, want %+v", got, tc.want)
			}
		})
	}
}
