package gatewaytest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// acmeProfile is a profile only the interceptor serves; its endpoint host
// and display name are profile material that must never be logged.
const acmeProfile = `[{"id":"acme-api","displayName":"Acme Secret Display","category":"PROVIDER_PROFILE_CATEGORY_OTHER",
"credentials":[{"name":"api_key","envVars":["ACME_API_KEY"],"required":true}],
"endpoints":[{"host":"api.acme-material.example","port":443}]}]`

func profileSourcesConfig(t *testing.T, name, endpoint, sources string) string {
	t.Helper()
	return writeConfig(t, "[openshell.gateway]\nprovider_profile_sources = "+sources+"\n"+
		"[[openshell.gateway.interceptors]]\nname = \""+name+"\"\ngrpc_endpoint = \""+endpoint+"\"\nallow_insecure_transport = true\ntimeout = \"5s\"\n")
}

func acmeProvider(name string) *openshellv1.CreateProviderRequest {
	return &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "acme-api",
		Credentials: map[string]string{"ACME_API_KEY": "acme-e2e-secret"},
	}}
}

// TestGatewayProfileSourceInterceptor: the real gateway with sources
// builtin, user and a profile-capable interceptor serves the interceptor's
// profile (usable in CreateProvider, listed with its source) next to the
// built-in ones; each capture logs the combined revision, fetch count and
// profile count at debug level and never profile material.
func TestGatewayProfileSourceInterceptor(t *testing.T) {
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "catalog", ProviderProfiles: true}, "allow", "[]", "-profiles", acmeProfile)
	cfg := profileSourcesConfig(t, "catalog", ep, `[{ type = "builtin" }, { type = "user" }, { type = "interceptor", name = "catalog" }]`)
	g := Start(t, Options{ExtraArgs: []string{"--config", cfg}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.CreateProvider(ctx, acmeProvider("acme")); err != nil {
		t.Fatalf("CreateProvider(acme-api) = %v, want the interceptor's profile to accept it", err)
	}
	if _, err := c.CreateProvider(ctx, newProvider("gh")); err != nil {
		t.Fatalf("CreateProvider(github) = %v, want built-in profiles kept", err)
	}
	p, err := c.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Id: "acme-api"})
	if err != nil {
		t.Fatalf("GetProviderProfile(acme-api): %v", err)
	}
	if p.GetProfile().GetSource() != "catalog" {
		t.Errorf("acme-api source = %q, want catalog", p.GetProfile().GetSource())
	}
	logs := g.Logs()
	if !strings.Contains(logs, "captured provider profile catalog snapshot") || !strings.Contains(logs, "catalog_revision=sha256:") ||
		!strings.Contains(logs, "source_fetch_count=3") || !strings.Contains(logs, "profile_count=") {
		t.Errorf("gateway log lacks the capture diagnostics:\n%s", logs)
	}
	for _, material := range []string{"api.acme-material.example", "Acme Secret Display", "ACME_API_KEY", "acme-e2e-secret"} {
		if strings.Contains(logs, material) {
			t.Errorf("gateway log contains profile material %q", material)
		}
	}
}

// TestGatewayProfileSourceDuplicate: an interceptor serving a built-in id
// makes profile lookups fail with a message naming both sources.
func TestGatewayProfileSourceDuplicate(t *testing.T) {
	dup := strings.Replace(acmeProfile, `"id":"acme-api"`, `"id":"GitHub"`, 1)
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "catalog", ProviderProfiles: true}, "allow", "[]", "-profiles", dup)
	cfg := profileSourcesConfig(t, "catalog", ep, `[{ type = "builtin" }, { type = "interceptor", name = "catalog" }]`)
	g := Start(t, Options{ExtraArgs: []string{"--config", cfg}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := g.Client().CreateProvider(ctx, newProvider("gh"))
	want := "duplicate provider profile id 'github' across configured sources 'builtin' and 'catalog'"
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
		t.Fatalf("CreateProvider = %v, want FailedPrecondition %q", err, want)
	}
}

// TestGatewayProfileSourceAuthoritative: selecting only the interceptor
// leaves out the built-in profiles.
func TestGatewayProfileSourceAuthoritative(t *testing.T) {
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "catalog", ProviderProfiles: true}, "allow", "[]", "-profiles", acmeProfile)
	cfg := profileSourcesConfig(t, "catalog", ep, `[{ type = "interceptor", name = "catalog" }]`)
	g := Start(t, Options{ExtraArgs: []string{"--config", cfg}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := g.Client()
	if _, err := c.CreateProvider(ctx, acmeProvider("acme")); err != nil {
		t.Fatalf("CreateProvider(acme-api): %v", err)
	}
	if _, err := c.CreateProvider(ctx, newProvider("gh")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateProvider(github) = %v, want InvalidArgument (built-in source not selected)", err)
	}
}

// TestGatewayRefusesProfileSource: naming an interceptor that does not
// advertise provider_profiles, or one not configured, stops the gateway.
func TestGatewayRefusesProfileSource(t *testing.T) {
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "plain"}, "allow", "[]")
	for _, tc := range []struct{ name, sources string }{
		{"not capable", `[{ type = "interceptor", name = "plain" }]`},
		{"not configured", `[{ type = "builtin" }, { type = "interceptor", name = "missing" }]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := TempDir(t)
			cmd := exec.Command(filepath.Join(BinDir(t), "openshell-gateway"), "--disable-tls", "--port", strconv.Itoa(freePort(t)), "--bind-address", "127.0.0.1",
				"--db-url", "sqlite:"+filepath.Join(dir, "openshell.db"), "--state-dir", dir, "--config", profileSourcesConfig(t, "plain", ep, tc.sources))
			cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("gateway = %v, want exit status 1\n%s", err, out)
			}
			if want := "is not configured or does not advertise provider_profiles"; !strings.Contains(string(out), want) {
				t.Errorf("gateway output lacks %q:\n%s", want, out)
			}
		})
	}
}
