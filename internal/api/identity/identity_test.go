package identity_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/identity"
	"github.com/openshell-go/openshell/internal/auth"
)

// minter mints "tok-<id>" expiring at exp.
type minter struct{ exp time.Time }

func (m minter) Mint(id string) (string, time.Time, error) { return "tok-" + id, m.exp, nil }

// TestAuthorization: each RPC mints only for a sandbox principal that
// authenticated the way the RPC expects, and only while its sandbox
// exists.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	exp := time.UnixMilli(1_900_000_000_000)
	svc := identity.New(identity.Options{Sandboxes: f.Engine, Minter: minter{exp: exp}})
	bootstrap := &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceK8sSABootstrap, SandboxID: f.SandboxA}
	gone, err := f.Engine.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Engine.Delete(t.Context(), "", "gone"); err != nil {
		t.Fatal(err)
	}
	calls := []apitest.Call{
		{Name: "RefreshSandboxToken", Do: func(ctx context.Context) error {
			r, err := svc.RefreshSandboxToken(ctx, &openshellv1.RefreshSandboxTokenRequest{})
			if err == nil && (r.GetToken() != "tok-"+f.SandboxA || r.GetExpiresAtMs() != exp.UnixMilli()) {
				t.Errorf("RefreshSandboxToken = %v, want tok-%s expiring at %d", r, f.SandboxA, exp.UnixMilli())
			}
			return err
		}},
		{Name: "IssueSandboxToken", Do: func(ctx context.Context) error {
			r, err := svc.IssueSandboxToken(ctx, &openshellv1.IssueSandboxTokenRequest{})
			if err == nil && r.GetToken() != "tok-"+f.SandboxA {
				t.Errorf("IssueSandboxToken = %v, want tok-%s", r, f.SandboxA)
			}
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "sandbox jwt", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{ok, denied}},
		{Name: "kubernetes bootstrap", P: bootstrap, Want: []codes.Code{denied, ok}},
		{Name: "deleted sandbox", P: apitest.Sandbox(gone.GetMetadata().GetId()), Want: []codes.Code{nf, denied}},
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{denied, denied}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{denied, denied}},
		{Name: "mtls user", P: apitest.MTLSUser, Want: []codes.Code{denied, denied}},
	})

	off := identity.New(identity.Options{Sandboxes: f.Engine})
	_, err = off.RefreshSandboxToken(apitest.As(t.Context(), apitest.Sandbox(f.SandboxA)), &openshellv1.RefreshSandboxTokenRequest{})
	apitest.WantErr(t, "RefreshSandboxToken without a minter", err, codes.Unavailable, "minting is not configured")
}
