package providers_test

import (
	stdcmp "cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/api/providers"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/lifecycle"
	domain "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
)

func newService(f *apitest.Env, oidc bool) *providers.Service {
	return providers.New(providers.Options{Engine: f.Engine, Authz: f.Authz(oidc), Providers: f.Providers})
}

func github(name, token string) *datamodelv1.Provider {
	return &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "github",
		Credentials: map[string]string{"GITHUB_TOKEN": token},
	}
}

// TestAuthorization: provider reads need membership of the workspace,
// provider writes its admin role, listing every workspace a platform
// admin; attachments follow the sandbox (user role); only the sandbox's
// own supervisor reads its provider environment.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	for _, ws := range []string{"team-a", "team-b"} {
		if _, err := f.Providers.Create(t.Context(), ws, github("gh", "secret")); err != nil {
			t.Fatal(err)
		}
	}
	var n atomic.Int64
	calls := []apitest.Call{
		{Name: "CreateProvider", Do: func(ctx context.Context) error {
			_, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Workspace: "team-a", Provider: github(fmt.Sprintf("p%d", n.Add(1)), "s")})
			return err
		}},
		{Name: "GetProvider", Do: func(ctx context.Context) error {
			_, err := svc.GetProvider(ctx, &openshellv1.GetProviderRequest{Workspace: "team-a", Name: "gh"})
			return err
		}},
		{Name: "ListProviders", Do: func(ctx context.Context) error {
			_, err := svc.ListProviders(ctx, &openshellv1.ListProvidersRequest{Workspace: "team-a"})
			return err
		}},
		{Name: "ListProviders(all)", Do: func(ctx context.Context) error {
			_, err := svc.ListProviders(ctx, &openshellv1.ListProvidersRequest{AllWorkspaces: true})
			return err
		}},
		{Name: "UpdateProvider", Do: func(ctx context.Context) error {
			_, err := svc.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Workspace: "team-a", Provider: &datamodelv1.Provider{
				Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Config: map[string]string{"K": "v"},
			}})
			return err
		}},
		{Name: "DeleteProvider", Do: func(ctx context.Context) error {
			_, err := svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Workspace: "team-a", Name: "missing"})
			return err
		}},
		{Name: "ListProviderProfiles", Do: func(ctx context.Context) error {
			_, err := svc.ListProviderProfiles(ctx, &openshellv1.ListProviderProfilesRequest{Workspace: "team-a"})
			return err
		}},
		{Name: "GetProviderProfile", Do: func(ctx context.Context) error {
			_, err := svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Workspace: "team-a", Id: "github"})
			return err
		}},
		{Name: "ListSandboxProviders", Do: func(ctx context.Context) error {
			_, err := svc.ListSandboxProviders(ctx, &openshellv1.ListSandboxProvidersRequest{SandboxName: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "AttachSandboxProvider", Do: func(ctx context.Context) error {
			_, err := svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", Workspace: "team-a", ProviderName: "gh"})
			return err
		}},
		{Name: "DetachSandboxProvider", Do: func(ctx context.Context) error {
			_, err := svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", Workspace: "team-a", ProviderName: "gh"})
			return err
		}},
		{Name: "GetSandboxProviderEnvironment", Do: func(ctx context.Context) error {
			_, err := svc.GetSandboxProviderEnvironment(ctx, &openshellv1.GetSandboxProviderEnvironmentRequest{SandboxId: f.SandboxA})
			return err
		}},
	}
	const (
		ok = codes.OK
		nf = codes.NotFound
		pd = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, pd}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, pd}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, ok, ok, pd, ok, ok, ok, ok, ok, ok, ok, pd}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{pd, ok, ok, pd, pd, pd, ok, ok, ok, ok, ok, pd}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{pd, pd, pd, pd, pd, pd, pd, pd, nf, nf, nf, pd}},
		{Name: "own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{pd, pd, pd, pd, pd, pd, pd, pd, nf, nf, nf, ok}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{pd, pd, pd, pd, pd, pd, pd, pd, nf, nf, nf, pd}},
	})
}

// TestCreateValidation: OpenShell's rules and texts for a new provider.
func TestCreateValidation(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	if _, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: github("gh", "s")}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 8193)
	many := map[string]string{}
	for i := range 33 {
		many[fmt.Sprintf("K%d", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		p    *datamodelv1.Provider
		code codes.Code
		msg  string
	}{
		{"no provider", nil, codes.InvalidArgument, "provider is required"},
		{"no type", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Credentials: map[string]string{"K": "v"}}, codes.InvalidArgument, "provider.type is required"},
		{"no name", &datamodelv1.Provider{Type: "github", Credentials: map[string]string{"K": "v"}}, codes.InvalidArgument, "provider metadata.name cannot be empty"},
		{"unknown type", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "no-such", Credentials: map[string]string{"K": "v"}}, codes.InvalidArgument, "unsupported provider type: no-such"},
		{"handles supplied", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "github", Credentials: map[string]string{"K": "v"},
			CredentialHandles: map[string]*datamodelv1.CredentialHandle{"X": {Driver: "d"}}}, codes.InvalidArgument, "provider.credential_handles is internal gateway state and cannot be supplied"},
		{"empty credentials", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "github"}, codes.InvalidArgument, "provider.credentials must not be empty"},
		{"empty credentials generic", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "generic"}, codes.InvalidArgument, "provider.credentials must not be empty"},
		{"value too long", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "github", Credentials: map[string]string{"K": long}}, codes.InvalidArgument, "provider.credentials value exceeds maximum length (8193 > 8192)"},
		{"too many credentials", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "generic", Credentials: many}, codes.InvalidArgument, "provider.credentials exceeds maximum entries (33 > 32)"},
		{"empty key", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "generic", Credentials: map[string]string{"": "v"}}, codes.InvalidArgument, "provider.credentials key must not be empty"},
		{"name too long", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: strings.Repeat("n", 254)}, Type: "generic", Credentials: map[string]string{"K": "v"}}, codes.InvalidArgument, "provider.name exceeds maximum length (254 > 253)"},
		{"negative expiry", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "generic", Credentials: map[string]string{"K": "v"}, CredentialExpiresAtMs: map[string]int64{"K": -1}}, codes.InvalidArgument, "provider.credential_expires_at_ms value must be greater than or equal to 0"},
		{"profile workspace", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "a"}, Type: "generic", Credentials: map[string]string{"K": "v"}, ProfileWorkspace: "other"}, codes.InvalidArgument, "profile_workspace must be empty (global) or match the provider workspace"},
		{"duplicate", github("gh", "s"), codes.AlreadyExists, "provider 'gh' already exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: tc.p})
			apitest.WantErr(t, "CreateProvider", err, tc.code, tc.msg)
			if err != nil && strings.Contains(err.Error(), long) {
				t.Error("the error carries the credential value")
			}
		})
	}
	// A profile without required credentials takes none.
	if _, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "pypi"}, Type: "PyPI"}}); err != nil {
		t.Errorf("pypi without credentials: %v", err)
	}
}

// TestCRUD: responses redact every value; update merges and honours
// expected_resource_version; delete follows OpenShell.
func TestCRUD(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	created, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: github("gh", "tok-1")})
	if err != nil {
		t.Fatal(err)
	}
	rv := created.GetProvider().GetMetadata().GetResourceVersion()
	got, err := svc.GetProvider(ctx, &openshellv1.GetProviderRequest{Name: "gh"})
	if err != nil {
		t.Fatal(err)
	}
	if c := got.GetProvider().GetCredentials(); len(c) != 1 || c["GITHUB_TOKEN"] != "REDACTED" || len(got.GetProvider().GetCredentialHandles()) != 0 {
		t.Errorf("GetProvider credentials = %v, handles = %v; want GITHUB_TOKEN=REDACTED and no handles", c, got.GetProvider().GetCredentialHandles())
	}
	if got.GetProvider().GetMetadata().GetWorkspace() != "default" || got.GetProvider().GetType() != "github" {
		t.Errorf("GetProvider metadata = %v", got.GetProvider().GetMetadata())
	}
	_, err = svc.GetProvider(ctx, &openshellv1.GetProviderRequest{Name: "nope"})
	apitest.WantErr(t, "GetProvider(missing)", err, codes.NotFound, "provider 'nope' not found")

	upd, err := svc.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{
		Provider: &datamodelv1.Provider{
			Metadata:    &datamodelv1.ObjectMeta{Name: "gh", ResourceVersion: rv},
			Credentials: map[string]string{"GITHUB_TOKEN": "", "GH_TOKEN": "tok-2"}, Config: map[string]string{"base": "x"},
		},
		CredentialExpiresAtMs: map[string]int64{"GH_TOKEN": 4_000_000_000_000},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := upd.GetProvider()
	if c := p.GetCredentials(); len(c) != 1 || c["GH_TOKEN"] != "REDACTED" || p.GetConfig()["base"] != "x" || p.GetCredentialExpiresAtMs()["GH_TOKEN"] != 4_000_000_000_000 {
		t.Errorf("after update: credentials %v config %v expiry %v", c, p.GetConfig(), p.GetCredentialExpiresAtMs())
	}
	_, err = svc.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh", ResourceVersion: rv}, Config: map[string]string{"base": "y"},
	}})
	apitest.WantErr(t, "UpdateProvider(stale)", err, codes.Aborted, "provider 'gh' was modified concurrently")
	_, err = svc.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "gitlab"}})
	apitest.WantErr(t, "UpdateProvider(type)", err, codes.InvalidArgument, "provider type cannot be changed; delete and recreate the provider")
	_, err = svc.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "nope"}}})
	apitest.WantErr(t, "UpdateProvider(missing)", err, codes.NotFound, "provider 'nope' not found")

	list, err := svc.ListProviders(ctx, &openshellv1.ListProvidersRequest{})
	if err != nil || len(list.GetProviders()) != 1 || list.GetProviders()[0].GetCredentials()["GH_TOKEN"] != "REDACTED" {
		t.Fatalf("ListProviders = %v, %v", list, err)
	}
	_, err = svc.ListProviders(ctx, &openshellv1.ListProvidersRequest{AllWorkspaces: true, Workspace: "x"})
	apitest.WantErr(t, "ListProviders(both)", err, codes.InvalidArgument, "all_workspaces and workspace are mutually exclusive")

	// Delete while attached is refused, naming the sandbox.
	if _, err := env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "sb1", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh"}}}); err != nil {
		t.Fatalf("create a sandbox naming an existing provider: %v", err)
	}
	_, err = svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Name: "gh"})
	apitest.WantErr(t, "DeleteProvider(attached)", err, codes.FailedPrecondition, "provider 'gh' is attached to sandbox(es): sb1")
	if _, err := svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb1", ProviderName: "gh"}); err != nil {
		t.Fatal(err)
	}
	del, err := svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Name: "gh"})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteProvider = %v, %v, want deleted", del, err)
	}
	del, err = svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Name: "gh"})
	if err != nil || del.GetDeleted() {
		t.Fatalf("DeleteProvider(again) = %v, %v, want not deleted", del, err)
	}
	_, err = env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "sb2", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh"}}})
	apitest.WantErr(t, "create naming a deleted provider", err, codes.FailedPrecondition, "provider 'gh' not found")
}

// TestAttachDetach: attach and detach are idempotent, conditioned on
// expected_resource_version, and refuse unknown providers.
func TestAttachDetach(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	if _, err := env.Providers.Create(ctx, "default", github("gh", "s")); err != nil {
		t.Fatal(err)
	}
	sb, err := env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", ProviderName: "nope"})
	apitest.WantErr(t, "attach unknown", err, codes.FailedPrecondition, "provider 'nope' not found")
	_, err = svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb"})
	apitest.WantErr(t, "attach nameless", err, codes.InvalidArgument, "provider_name is required")

	cur, err := env.Engine.Get(ctx, "", "sb")
	if err != nil {
		t.Fatal(err)
	}
	stale := sb.GetMetadata().GetResourceVersion()
	if cur.GetMetadata().GetResourceVersion() == stale {
		// Make the create-time version stale for sure.
		if _, _, err := env.Engine.EditProviders(ctx, "", "sb", 0, func(p []string) ([]string, bool) { return append(p, "x"), true }); err != nil {
			t.Fatal(err)
		}
		if _, _, err := env.Engine.EditProviders(ctx, "", "sb", 0, func([]string) ([]string, bool) { return nil, true }); err != nil {
			t.Fatal(err)
		}
	}
	_, err = svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh", ExpectedResourceVersion: stale})
	apitest.WantErr(t, "attach at a stale version", err, codes.Aborted, `sandbox "sb" was modified concurrently`)

	cur, _ = env.Engine.Get(ctx, "", "sb")
	a, err := svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh", ExpectedResourceVersion: cur.GetMetadata().GetResourceVersion()})
	if err != nil || !a.GetAttached() || len(a.GetSandbox().GetSpec().GetProviders()) != 1 {
		t.Fatalf("attach = %v, %v", a, err)
	}
	a, err = svc.AttachSandboxProvider(ctx, &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh"})
	if err != nil || a.GetAttached() {
		t.Fatalf("attach again = %v, %v, want attached=false", a, err)
	}
	l, err := svc.ListSandboxProviders(ctx, &openshellv1.ListSandboxProvidersRequest{SandboxName: "sb"})
	if err != nil || len(l.GetProviders()) != 1 || l.GetProviders()[0].GetCredentials()["GITHUB_TOKEN"] != "REDACTED" {
		t.Fatalf("ListSandboxProviders = %v, %v", l, err)
	}
	_, err = svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh", ExpectedResourceVersion: stale})
	apitest.WantErr(t, "detach at a stale version", err, codes.Aborted, `sandbox "sb" was modified concurrently`)
	d, err := svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh"})
	if err != nil || !d.GetDetached() || len(d.GetSandbox().GetSpec().GetProviders()) != 0 {
		t.Fatalf("detach = %v, %v", d, err)
	}
	d, err = svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh"})
	if err != nil || d.GetDetached() {
		t.Fatalf("detach again = %v, %v, want detached=false", d, err)
	}
}

// TestSandboxEnvironment: a supervisor that enforces endpoint bindings
// gets its sandbox's credential values, each bound to its provider
// profile's endpoints, as OpenShell's gateway hands them; one that does
// not gets none; expired credentials, keys that are not environment
// names and providers without profile endpoints are left out; the
// revision follows provider updates and detaches.
func TestSandboxEnvironment(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	const token = "ghp_the-real-token"
	if _, err := env.Providers.Create(ctx, "default", github("gh", token)); err != nil {
		t.Fatal(err)
	}
	nv := &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "nv"}, Type: "nvidia",
		Credentials: map[string]string{"NVIDIA_API_KEY": "nvapi-real", "not-an-env-name": "x"}, CredentialExpiresAtMs: map[string]int64{"NVIDIA_API_KEY": 1}}
	if _, err := env.Providers.Create(ctx, "default", nv); err != nil {
		t.Fatal(err)
	}
	gen := &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gen"}, Type: "generic", Credentials: map[string]string{"API_KEY": "generic-value"}}
	if _, err := env.Providers.Create(ctx, "default", gen); err != nil {
		t.Fatal(err)
	}
	sb, err := env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "sb", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh", "nv", "gen"}}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	get := func(id string, bindings bool) *openshellv1.GetSandboxProviderEnvironmentResponse {
		t.Helper()
		r, err := svc.GetSandboxProviderEnvironment(apitest.As(ctx, apitest.Sandbox(id)),
			&openshellv1.GetSandboxProviderEnvironmentRequest{SandboxId: id, SupportsStaticCredentialBindings: bindings})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	id := sb.GetMetadata().GetId()
	r := get(id, true)
	if len(r.GetEnvironment()) != 1 || r.GetEnvironment()["GITHUB_TOKEN"] != token {
		t.Errorf("environment keys = %v, want only GITHUB_TOKEN with its value (NVIDIA_API_KEY expired, API_KEY has no endpoint)", slices.Sorted(maps.Keys(r.GetEnvironment())))
	}
	want := &openshellv1.StaticCredentialBinding{
		Endpoints: []*openshellv1.StaticCredentialEndpointBinding{
			{Host: "api.github.com", Port: 443}, {Host: "api.github.com", Port: 443, Path: "/graphql"}, {Host: "github.com", Port: 443},
		},
	}
	got := r.GetStaticCredentialBindings()["GITHUB_TOKEN"]
	if diff := cmp.Diff(want.GetEndpoints(), got.GetEndpoints(), protocmp.Transform()); diff != "" || len(r.GetStaticCredentialBindings()) != 1 || got.GetCredentialIdentity() == "" {
		t.Errorf("bindings (-want +got):\n%s (identity %q, %d bindings)", diff, got.GetCredentialIdentity(), len(r.GetStaticCredentialBindings()))
	}
	rev := r.GetProviderEnvRevision()
	if rev == 0 {
		t.Error("provider_env_revision is 0 with providers attached")
	}
	if old := get(id, false); len(old.GetEnvironment()) != 0 || len(old.GetStaticCredentialBindings()) != 0 || old.GetProviderEnvRevision() != rev {
		t.Errorf("a supervisor without endpoint bindings got %d variables, %d bindings, revision %d", len(old.GetEnvironment()), len(old.GetStaticCredentialBindings()), old.GetProviderEnvRevision())
	}
	if o := get(other.GetMetadata().GetId(), true); len(o.GetEnvironment()) != 0 || o.GetProviderEnvRevision() != 0 {
		t.Errorf("a sandbox without providers got %d variables, revision %d", len(o.GetEnvironment()), o.GetProviderEnvRevision())
	}
	if _, err := env.Providers.Update(ctx, "default", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Credentials: map[string]string{"GITHUB_TOKEN": "ghp_rotated"}}, nil); err != nil {
		t.Fatal(err)
	}
	r2 := get(id, true)
	if r2.GetProviderEnvRevision() == rev || r2.GetEnvironment()["GITHUB_TOKEN"] != "ghp_rotated" {
		t.Errorf("after an update: revision changed %v, new value delivered %v", r2.GetProviderEnvRevision() != rev, r2.GetEnvironment()["GITHUB_TOKEN"] == "ghp_rotated")
	}
	if _, err := svc.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh"}); err != nil {
		t.Fatal(err)
	}
	r3 := get(id, true)
	if _, ok := r3.GetEnvironment()["GITHUB_TOKEN"]; ok || r3.GetProviderEnvRevision() == r2.GetProviderEnvRevision() {
		t.Errorf("after detach: GITHUB_TOKEN still there %v, revision %d (was %d)", ok, r3.GetProviderEnvRevision(), r2.GetProviderEnvRevision())
	}
}

// TestProfiles: the built-in catalog is listed and paged; an unknown id
// is NotFound.
func TestProfiles(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	all, err := svc.ListProviderProfiles(ctx, &openshellv1.ListProviderProfilesRequest{})
	if err != nil || len(all.GetProfiles()) < 19 {
		t.Fatalf("ListProviderProfiles = %d profiles, %v", len(all.GetProfiles()), err)
	}
	page, err := svc.ListProviderProfiles(ctx, &openshellv1.ListProviderProfilesRequest{Limit: 2, Offset: 1})
	if err != nil || len(page.GetProfiles()) != 2 || page.GetProfiles()[0].GetId() != all.GetProfiles()[1].GetId() {
		t.Fatalf("page = %v, %v", page, err)
	}
	p, err := svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Id: "nvidia"})
	if err != nil || p.GetProfile().GetEndpoints()[0].GetHost() != "integrate.api.nvidia.com" || !p.GetProfile().GetInferenceCapable() {
		t.Fatalf("GetProviderProfile(nvidia) = %v, %v", p, err)
	}
	_, err = svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Id: "nope"})
	apitest.WantErr(t, "GetProviderProfile(nope)", err, codes.NotFound, "provider profile 'nope' not found")
}

// hookStore runs a hook before the first Create of objType (default
// provider).
type hookStore struct {
	store.Store
	objType string
	once    sync.Once
	hook    func()
}

func (h *hookStore) Create(ctx context.Context, objType string, msg proto.Message) (store.WriteResult, error) {
	if objType == stdcmp.Or(h.objType, store.TypeProvider) {
		h.once.Do(h.hook)
	}
	return h.Store.Create(ctx, objType, msg)
}

// markTerminating marks workspace ws TERMINATING, as a delete does first.
func markTerminating(t *testing.T, st store.Store, ws string) {
	if _, _, err := store.UpdateCASAs(t.Context(), st, store.TypeWorkspace, authz.WorkspaceID(ws), 0,
		func() *datamodelv1.Workspace { return &datamodelv1.Workspace{} },
		func(w *datamodelv1.Workspace) error { w.Status.Phase = authz.WorkspaceTerminating; return nil }); err != nil {
		t.Errorf("mark terminating: %v", err)
	}
}

// TestCreateRacesWorkspaceDelete is the regression test for a provider
// created while its workspace was being deleted: the check before the
// insert passed, the workspace turned TERMINATING before the row landed,
// and the provider (with its credentials) outlived the workspace. The
// create now re-checks after the insert and removes its row.
func TestCreateRacesWorkspaceDelete(t *testing.T) {
	env := apitest.NewEnv(t)
	apitest.CreateWorkspace(t, env.Store, "doomed")
	hs := &hookStore{Store: env.Store}
	hs.hook = func() { markTerminating(t, env.Store, "doomed") }
	kr, err := credentials.LoadOrCreateKEK(t.TempDir() + "/kek")
	if err != nil {
		t.Fatal(err)
	}
	provs := domain.NewStore(domain.Options{Objects: hs, Keyring: kr})
	svc := providers.New(providers.Options{Engine: env.Engine, Authz: env.Authz(false), Providers: provs})
	_, err = svc.CreateProvider(t.Context(), &openshellv1.CreateProviderRequest{Workspace: "doomed", Provider: github("gh", "s")})
	apitest.WantErr(t, "CreateProvider", err, codes.FailedPrecondition, `workspace "doomed" is being deleted`)
	if ps, err := provs.List(t.Context(), store.ListOptions{Workspace: "doomed"}); err != nil || len(ps) != 0 {
		t.Fatalf("providers left in the terminating workspace: %d, %v", len(ps), err)
	}
}

// deletingStore deletes provider "gh" right after the first sandbox
// write, standing in for a DeleteProvider that scanned the sandboxes
// before the attach landed.
type deletingStore struct {
	store.Store
	once  sync.Once
	provs func() *domain.Store
}

func (d *deletingStore) Update(ctx context.Context, objType string, msg proto.Message, expectedRV uint64) (store.WriteResult, error) {
	res, err := d.Store.Update(ctx, objType, msg, expectedRV)
	if err == nil && objType == store.TypeSandbox {
		d.once.Do(func() {
			if _, derr := d.provs().Delete(ctx, "default", "gh", func(context.Context) ([]string, error) { return nil, nil }); derr != nil {
				panic(derr)
			}
		})
	}
	return res, err
}

// TestAttachRacesProviderDelete is the regression test for an attach
// landing after a DeleteProvider's sandbox scan: the sandbox named a
// provider that no longer existed. The attach now re-checks and takes
// the attachment back.
func TestAttachRacesProviderDelete(t *testing.T) {
	env := apitest.NewEnv(t)
	if _, err := env.Providers.Create(t.Context(), "default", github("gh", "s")); err != nil {
		t.Fatal(err)
	}
	ds := &deletingStore{Store: env.Store, provs: func() *domain.Store { return env.Providers }}
	eng, err := lifecycle.New(t.Context(), lifecycle.Options{Store: lifecycle.ObjectStore{S: ds}, Driver: env.Driver, ProviderExists: env.Providers.Exists})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Engine.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "sb"}); err != nil {
		t.Fatal(err)
	}
	svc := providers.New(providers.Options{Engine: eng, Authz: env.Authz(false), Providers: env.Providers})
	_, err = svc.AttachSandboxProvider(t.Context(), &openshellv1.AttachSandboxProviderRequest{SandboxName: "sb", ProviderName: "gh"})
	apitest.WantErr(t, "AttachSandboxProvider", err, codes.FailedPrecondition, "provider 'gh' not found")
	sb, err := env.Engine.Get(t.Context(), "", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if p := sb.GetSpec().GetProviders(); len(p) != 0 {
		t.Errorf("sandbox still names %v after the refused attach", p)
	}
}
