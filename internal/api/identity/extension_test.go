package identity_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/identity"
	"github.com/openshell-go/openshell/internal/auth/sandboxjwt"
)

var _ identity.ExtensionMinter = (*sandboxjwt.Issuer)(nil)

// issuer returns a real sandbox JWT issuer with sandbox token lifetime ttl
// and its public key.
func issuer(t *testing.T, ttl time.Duration) (*sandboxjwt.Issuer, ed25519.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := sandboxjwt.KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := sandboxjwt.NewIssuer(priv, kid, "gw", ttl)
	if err != nil {
		t.Fatal(err)
	}
	return iss, pub
}

// services selects scan, plain (no authentication) and spaced (an invalid
// audience) for every sandbox, recording which sandbox was resolved.
func services(asked *[]string) identity.ExtensionServices {
	return func(_ context.Context, id string) ([]*sandboxv1.SupervisorMiddlewareService, error) {
		*asked = append(*asked, id)
		return []*sandboxv1.SupervisorMiddlewareService{
			{Name: "scan", GrpcEndpoint: "https://scan.example:50051", Audience: "urn:openshell:extension:middleware:scan"},
			{Name: "plain", GrpcEndpoint: "http://plain.example:50051", AllowInsecureTransport: true},
			{Name: "spaced", GrpcEndpoint: "https://spaced.example", Audience: " urn:x"},
		}, nil
	}
}

// TestExtensionCredentials: RefreshSandboxToken mints one caller_kind
// supervisor token per requested service the sandbox's policy selects
// (OpenShell's claims, verifiable with the gateway key, 15 minutes when
// sandbox tokens never expire, else the sandbox token lifetime capped at an
// hour), for the caller's own sandbox; it refuses with OpenShell's texts a
// service not selected, one that opted out of authentication, an invalid
// audience, empty, duplicate or too many names. Without a service
// resolver (this gateway: no supervisor middleware) every name is refused.
func TestExtensionCredentials(t *testing.T) {
	f := apitest.NewFixture(t)
	ctx := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	refresh := func(svc *identity.Service, names ...string) (*openshellv1.RefreshSandboxTokenResponse, error) {
		return svc.RefreshSandboxToken(ctx, &openshellv1.RefreshSandboxTokenRequest{ExtensionServiceNames: names})
	}

	for _, tc := range []struct {
		sandboxTTL, want time.Duration
	}{{0, 15 * time.Minute}, {10 * time.Minute, 10 * time.Minute}, {2 * time.Hour, time.Hour}} {
		t.Run(fmt.Sprintf("sandbox ttl %v", tc.sandboxTTL), func(t *testing.T) {
			iss, pub := issuer(t, tc.sandboxTTL)
			var asked []string
			svc := identity.New(identity.Options{Sandboxes: f.Engine, Minter: iss, ExtensionServices: services(&asked)})
			r, err := refresh(svc, "scan")
			if err != nil {
				t.Fatalf("RefreshSandboxToken(scan): %v", err)
			}
			if r.GetToken() == "" || len(r.GetExtensionCredentials()) != 1 || r.GetExtensionCredentials()[0].GetServiceName() != "scan" {
				t.Fatalf("RefreshSandboxToken(scan) = %v, want a sandbox token and one credential for scan", r)
			}
			cred := r.GetExtensionCredentials()[0]
			parsed, err := jwt.ParseSigned(cred.GetToken(), []jose.SignatureAlgorithm{jose.EdDSA})
			if err != nil {
				t.Fatal(err)
			}
			if typ := parsed.Headers[0].ExtraHeaders[jose.HeaderType]; typ != sandboxjwt.ExtensionTokenType {
				t.Errorf("typ = %v, want %s", typ, sandboxjwt.ExtensionTokenType)
			}
			var claims map[string]any
			if err := parsed.Claims(pub, &claims); err != nil {
				t.Fatalf("credential does not verify with the gateway key: %v", err)
			}
			want := map[string]any{"iss": "openshell-gateway:gw", "aud": "urn:openshell:extension:middleware:scan", "sub": "spiffe://openshell/sandbox/" + f.SandboxA, "caller_kind": "supervisor", "sandbox_id": f.SandboxA}
			for k, v := range want {
				if claims[k] != v {
					t.Errorf("claim %s = %v, want %v", k, claims[k], v)
				}
			}
			exp, iat := int64(claims["exp"].(float64)), int64(claims["iat"].(float64))
			if life := time.Duration(exp-iat) * time.Second; life != tc.want || cred.GetExpiresAtMs() != exp*1000 {
				t.Errorf("credential lifetime %v, expires_at_ms %d, want %v ending at exp %d", life, cred.GetExpiresAtMs(), tc.want, exp)
			}
			if !cmp.Equal(asked, []string{f.SandboxA}) {
				t.Errorf("services resolved for %v, want the caller's sandbox %s only", asked, f.SandboxA)
			}
		})
	}

	iss, _ := issuer(t, 0)
	var asked []string
	svc := identity.New(identity.Options{Sandboxes: f.Engine, Minter: iss, ExtensionServices: services(&asked)})
	if r, err := refresh(svc); err != nil || len(r.GetExtensionCredentials()) != 0 || len(asked) != 0 {
		t.Errorf("RefreshSandboxToken() = %v, %v (resolved %v), want a token, no credentials and no policy resolution", r, err, asked)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("s%d", i)
	}
	for _, tc := range []struct {
		names []string
		code  codes.Code
		msg   string
	}{
		{[]string{"scan", "nope"}, codes.PermissionDenied, "extension service 'nope' is not selected by the sandbox policy"},
		{[]string{"plain"}, codes.FailedPrecondition, "extension service 'plain' opted out of extension authentication; no credential is minted for it"},
		{[]string{"spaced"}, codes.FailedPrecondition, "extension audience must not have leading or trailing whitespace"},
		{[]string{"scan", ""}, codes.InvalidArgument, "extension service names must not be empty"},
		{[]string{"scan", "scan"}, codes.InvalidArgument, "duplicate extension service name 'scan'"},
		{many, codes.InvalidArgument, "at most 64 extension credentials may be requested"},
	} {
		svc := identity.New(identity.Options{Sandboxes: f.Engine, Minter: iss, ExtensionServices: services(new([]string))})
		_, err := refresh(svc, tc.names...)
		apitest.WantErr(t, fmt.Sprintf("RefreshSandboxToken(%.40q)", tc.names), err, tc.code, tc.msg)
	}

	none := identity.New(identity.Options{Sandboxes: f.Engine, Minter: iss})
	_, err := refresh(none, "scan")
	apitest.WantErr(t, "RefreshSandboxToken(scan) without supervisor middleware", err, codes.PermissionDenied, "extension service 'scan' is not selected by the sandbox policy")
}

// TestExtensionCredentialsRateLimit: each sandbox may ask for extension
// credentials 10 times a minute (OpenShell's bound, since each request
// resolves its policy); the 11th is ResourceExhausted while another
// sandbox and plain token refreshes are unaffected.
func TestExtensionCredentialsRateLimit(t *testing.T) {
	f := apitest.NewFixture(t)
	iss, _ := issuer(t, 0)
	svc := identity.New(identity.Options{Sandboxes: f.Engine, Minter: iss, ExtensionServices: services(new([]string))})
	as := func(id string) context.Context { return apitest.As(t.Context(), apitest.Sandbox(id)) }
	scan := &openshellv1.RefreshSandboxTokenRequest{ExtensionServiceNames: []string{"scan"}}
	for i := range 10 {
		if _, err := svc.RefreshSandboxToken(as(f.SandboxA), scan); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	_, err := svc.RefreshSandboxToken(as(f.SandboxA), scan)
	apitest.WantErr(t, "11th request in a minute", err, codes.ResourceExhausted, "extension credential minting rate limit exceeded for this sandbox")
	if _, err := svc.RefreshSandboxToken(as(f.SandboxA), &openshellv1.RefreshSandboxTokenRequest{}); err != nil {
		t.Errorf("plain refresh after the limit: %v", err)
	}
	if _, err := svc.RefreshSandboxToken(as(f.SandboxB), scan); err != nil {
		t.Errorf("another sandbox after the limit: %v", err)
	}
}
