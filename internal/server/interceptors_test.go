package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func newTestPipeline(t *testing.T, authn auth.Authenticator) *pipeline {
	t.Helper()
	authz, err := auth.NewAuthorizer(auth.AuthorizerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{log: testLogger(t), authn: authn, authz: authz, metrics: m}
}

func TestUnaryInterceptorErrors(t *testing.T) {
	p := newTestPipeline(t, auth.NewChain(auth.ChainOptions{}))
	info := &grpc.UnaryServerInfo{FullMethod: "/openshell.v1.OpenShell/GetSandbox"}
	tests := []struct {
		name    string
		handler grpc.UnaryHandler
		code    codes.Code
		msg     string
	}{
		{"ok", func(context.Context, any) (any, error) { return "resp", nil }, codes.OK, ""},
		{"kind", func(context.Context, any) (any, error) {
			return nil, fmt.Errorf("sandbox %q: %w", "a", errdefs.ErrNotFound)
		}, codes.NotFound, `sandbox "a"`},
		{"exact", func(context.Context, any) (any, error) { return nil, errdefs.Conflict("resource version mismatch") }, codes.Aborted, "resource version mismatch"},
		{"unknown", func(context.Context, any) (any, error) { return nil, errors.New("db at /secret/path exploded") }, codes.Internal, "internal error"},
		{"status", func(context.Context, any) (any, error) { return nil, status.Error(codes.OutOfRange, "keep me") }, codes.OutOfRange, "keep me"},
		{"panic", func(context.Context, any) (any, error) { panic("boom") }, codes.Internal, "internal error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.unary(t.Context(), nil, info, tc.handler)
			st := status.Convert(err)
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("unary() = %v %q, want %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}

func TestAdmitStripsAuthSourceAndSetsPrincipal(t *testing.T) {
	var seen metadata.MD
	authn := auth.AuthenticatorFunc(func(_ context.Context, r *auth.Request) (*auth.Principal, error) {
		seen = r.Metadata
		return &auth.Principal{Kind: auth.KindUser, Subject: "u"}, nil
	})
	p := newTestPipeline(t, authn)
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(auth.AuthSourceHeader, "oidc", "x-other", "v"))
	var handlerMD metadata.MD
	var principal *auth.Principal
	_, err := p.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/openshell.v1.OpenShell/GetCurrentUser"},
		func(ctx context.Context, _ any) (any, error) {
			handlerMD, _ = metadata.FromIncomingContext(ctx)
			principal, _ = auth.FromContext(ctx)
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	for name, md := range map[string]metadata.MD{"authenticator": seen, "handler": handlerMD} {
		if got := md.Get(auth.AuthSourceHeader); len(got) != 0 {
			t.Errorf("%s sees %s = %v, want it stripped", name, auth.AuthSourceHeader, got)
		}
		if got := md.Get("x-other"); len(got) != 1 {
			t.Errorf("%s sees x-other = %v, want it kept", name, got)
		}
	}
	if principal == nil || principal.Subject != "u" {
		t.Errorf("handler principal = %+v, want subject u", principal)
	}
}

func TestRateLimiterWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &rateLimiter{limit: 2, window: time.Second, now: func() time.Time { return now }}
	got := []bool{r.allow(), r.allow(), r.allow()}
	now = now.Add(time.Second)
	got = append(got, r.allow())
	want := []bool{true, true, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allow() sequence = %v, want %v", got, want)
		}
	}
}
