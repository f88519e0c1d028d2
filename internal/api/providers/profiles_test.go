package providers_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/providers"
	domain "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/providers/profiles"
)

// acme is a user profile with one credential and one endpoint.
func acme(id string) *openshellv1.ProviderProfileImportItem {
	return &openshellv1.ProviderProfileImportItem{Source: id + ".yaml", Profile: &openshellv1.ProviderProfile{
		Id: id, DisplayName: "Acme",
		Credentials: []*openshellv1.ProviderProfileCredential{{Name: "token", EnvVars: []string{"ACME_TOKEN"}, Required: true}},
		Endpoints:   []*sandboxv1.NetworkEndpoint{{Host: "api.acme.test", Port: 8443}},
	}}
}

func diagTexts(ds []*openshellv1.ProviderProfileDiagnostic) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.GetSeverity()+": "+d.GetMessage())
	}
	return strings.Join(out, "; ")
}

// TestProfileAuthorization: profile writes in a workspace need its admin
// role, in the platform scope a platform admin; lint needs the user role;
// sandboxes get nothing.
func TestProfileAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	if _, _, err := f.Providers.ImportProfiles(t.Context(), "team-a", []*openshellv1.ProviderProfileImportItem{acme("acme")}); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	imported := func(r *openshellv1.ImportProviderProfilesResponse, err error) error {
		if err == nil && !r.GetImported() {
			return fmt.Errorf("not imported: %s", diagTexts(r.GetDiagnostics()))
		}
		return err
	}
	calls := []apitest.Call{
		{Name: "ImportProviderProfiles", Do: func(ctx context.Context) error {
			return imported(svc.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: "team-a",
				Profiles: []*openshellv1.ProviderProfileImportItem{acme(fmt.Sprintf("p%d", n.Add(1)))}}))
		}},
		{Name: "ImportProviderProfiles(platform)", Do: func(ctx context.Context) error {
			return imported(svc.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{
				Profiles: []*openshellv1.ProviderProfileImportItem{acme(fmt.Sprintf("q%d", n.Add(1)))}}))
		}},
		{Name: "UpdateProviderProfiles", Do: func(ctx context.Context) error {
			cur, err := f.Providers.Profile(t.Context(), "team-a", "acme")
			if err != nil {
				return err
			}
			r, err := svc.UpdateProviderProfiles(ctx, &openshellv1.UpdateProviderProfilesRequest{Workspace: "team-a", Id: "acme",
				Profile: acme("acme"), ExpectedResourceVersion: cur.GetResourceVersion()})
			if err == nil && !r.GetUpdated() {
				return fmt.Errorf("not updated: %s", diagTexts(r.GetDiagnostics()))
			}
			return err
		}},
		{Name: "LintProviderProfiles", Do: func(ctx context.Context) error {
			_, err := svc.LintProviderProfiles(ctx, &openshellv1.LintProviderProfilesRequest{Workspace: "team-a", Profiles: []*openshellv1.ProviderProfileImportItem{acme("x")}})
			return err
		}},
		{Name: "DeleteProviderProfile", Do: func(ctx context.Context) error {
			_, err := svc.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Workspace: "team-a", Id: "missing"})
			return err
		}},
		{Name: "GetProviderProfile(user profile)", Do: func(ctx context.Context) error {
			_, err := svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Workspace: "team-a", Id: "acme"})
			return err
		}},
	}
	const (
		ok = codes.OK
		nf = codes.NotFound
		pd = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, ok, nf, ok}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, nf, ok}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, pd, ok, ok, nf, ok}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{pd, pd, pd, ok, pd, ok}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{pd, pd, pd, pd, pd, pd}},
		{Name: "sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{pd, pd, pd, pd, pd, pd}},
	})
}

// TestUserProfiles: import, lint, update and delete of user profiles,
// their workspace scoping (another workspace's profile is invisible and
// unusable, platform profiles are visible everywhere), providers created
// against them, and their endpoints binding the sandbox's credentials.
func TestUserProfiles(t *testing.T) {
	env := apitest.NewEnv(t)
	apitest.CreateWorkspace(t, env.Store, "team-a")
	svc := newService(env, false)
	ctx := apitest.As(t.Context(), apitest.LocalDev) // platform writes need a platform admin
	imp := func(ws string, items ...*openshellv1.ProviderProfileImportItem) *openshellv1.ImportProviderProfilesResponse {
		t.Helper()
		r, err := svc.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: ws, Profiles: items})
		if err != nil {
			t.Fatalf("ImportProviderProfiles: %v", err)
		}
		return r
	}
	r := imp("team-a", acme("Acme"))
	if !r.GetImported() || len(r.GetProfiles()) != 1 || r.GetProfiles()[0].GetId() != "acme" || r.GetProfiles()[0].GetResourceVersion() == 0 ||
		r.GetProfiles()[0].GetSource() != "user" || r.GetProfiles()[0].GetScope() != "workspace" {
		t.Fatalf("import = %v", r)
	}
	for name, tc := range map[string]struct {
		items []*openshellv1.ProviderProfileImportItem
		want  string
	}{
		"again":          {[]*openshellv1.ProviderProfileImportItem{acme("acme")}, "error: custom provider profile 'acme' already exists"},
		"builtin":        {[]*openshellv1.ProviderProfileImportItem{acme("github")}, "error: provider profile 'github' is managed by source 'builtin' and cannot be overwritten"},
		"duplicate":      {[]*openshellv1.ProviderProfileImportItem{acme("b"), acme("b")}, "error: duplicate provider profile id: b"},
		"empty":          {nil, "error: at least one provider profile is required"},
		"all or nothing": {[]*openshellv1.ProviderProfileImportItem{acme("fine"), acme("github")}, "managed by source 'builtin'"},
	} {
		r := imp("team-a", tc.items...)
		if r.GetImported() || !strings.Contains(diagTexts(r.GetDiagnostics()), tc.want) {
			t.Errorf("%s: imported %v, diagnostics %q, want %q", name, r.GetImported(), diagTexts(r.GetDiagnostics()), tc.want)
		}
	}
	if _, err := svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Workspace: "team-a", Id: "fine"}); err == nil {
		t.Error("a refused import stored part of its batch")
	}

	bad := acme("bad")
	bad.Profile.Credentials[0].EnvVars = []string{"NOT-AN-ENV"}
	bad.Profile.Endpoints = append(bad.Profile.Endpoints, &sandboxv1.NetworkEndpoint{Port: 1})
	bad.Profile.Credentials[0].Refresh = &openshellv1.ProviderCredentialRefresh{TokenUrl: "http://auth.example.com/token"}
	lint, err := svc.LintProviderProfiles(ctx, &openshellv1.LintProviderProfilesRequest{Workspace: "team-a", Profiles: []*openshellv1.ProviderProfileImportItem{bad}})
	if err != nil || lint.GetValid() || len(lint.GetDiagnostics()) != 3 {
		t.Errorf("lint = %v (%s), %v; want invalid with 3 diagnostics", lint.GetValid(), diagTexts(lint.GetDiagnostics()), err)
	}

	// Workspace scoping.
	if _, err := svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Workspace: "team-a", Id: "acme"}); err != nil {
		t.Errorf("GetProviderProfile in its workspace: %v", err)
	}
	_, err = svc.GetProviderProfile(ctx, &openshellv1.GetProviderProfileRequest{Id: "acme"})
	apitest.WantErr(t, "GetProviderProfile from another workspace", err, codes.NotFound, "provider profile 'acme' not found")
	prov := func(ws, name string, pw string) (*openshellv1.ProviderResponse, error) {
		return svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Workspace: ws, Provider: &datamodelv1.Provider{
			Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "acme", ProfileWorkspace: pw, Credentials: map[string]string{"ACME_TOKEN": "acme-secret"}}})
	}
	p, err := prov("team-a", "a", "")
	if err != nil || p.GetProvider().GetProfileWorkspace() != "team-a" {
		t.Fatalf("CreateProvider against the workspace profile = %v, %v", p, err)
	}
	_, err = prov("", "a", "")
	apitest.WantErr(t, "CreateProvider against another workspace's profile", err, codes.InvalidArgument, "unsupported provider type: acme")
	_, err = prov("", "b", "team-a")
	apitest.WantErr(t, "CreateProvider naming another workspace's profile", err, codes.InvalidArgument, "profile_workspace must be empty (global) or match the provider workspace")

	// Update: a version is required and must be current.
	up := func(ws string, rv uint64, desc string) (*openshellv1.UpdateProviderProfilesResponse, error) {
		item := acme("acme")
		item.Profile.Description = desc
		return svc.UpdateProviderProfiles(ctx, &openshellv1.UpdateProviderProfilesRequest{Workspace: ws, Id: "acme", Profile: item, ExpectedResourceVersion: rv})
	}
	if u, err := up("team-a", 0, "x"); err != nil || u.GetUpdated() || !strings.Contains(diagTexts(u.GetDiagnostics()), "requires a non-zero resource_version") {
		t.Errorf("update without a version = %v, %v", u, err)
	}
	if u, err := up("", 1, "x"); err != nil || u.GetUpdated() || !strings.Contains(diagTexts(u.GetDiagnostics()), "custom provider profile 'acme' does not exist") {
		t.Errorf("update from another workspace = %v, %v", u, err)
	}
	cur := r.GetProfiles()[0].GetResourceVersion()
	u, err := up("team-a", cur, "v2")
	if err != nil || !u.GetUpdated() || u.GetProfile().GetDescription() != "v2" || u.GetProfile().GetResourceVersion() <= cur {
		t.Fatalf("update = %v, %v", u, err)
	}
	_, err = up("team-a", cur, "v3")
	apitest.WantErr(t, "update at a stale version", err, codes.Aborted, fmt.Sprintf("provider profile was modified concurrently (current resource_version: %d)", u.GetProfile().GetResourceVersion()))

	// The profile's endpoints bind the credential for the sandbox.
	sb, err := env.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "sb", Workspace: "team-a", Spec: &openshellv1.SandboxSpec{Providers: []string{"a"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	e, err := svc.GetSandboxProviderEnvironment(apitest.As(ctx, apitest.Sandbox(id)), &openshellv1.GetSandboxProviderEnvironmentRequest{SandboxId: id, SupportsStaticCredentialBindings: true})
	if err != nil {
		t.Fatal(err)
	}
	if eps := e.GetStaticCredentialBindings()["ACME_TOKEN"].GetEndpoints(); e.GetEnvironment()["ACME_TOKEN"] != "acme-secret" || len(eps) != 1 || eps[0].GetHost() != "api.acme.test" || eps[0].GetPort() != 8443 {
		t.Errorf("environment from a user profile: value delivered %v, endpoints %v", e.GetEnvironment()["ACME_TOKEN"] == "acme-secret", eps)
	}

	// Delete: refused while a provider uses it, and for built-ins.
	_, err = svc.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Workspace: "team-a", Id: "acme"})
	apitest.WantErr(t, "DeleteProviderProfile in use", err, codes.FailedPrecondition, "provider profile 'acme' is in use by providers: team-a/a")
	_, err = svc.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Workspace: "team-a", Id: "github"})
	apitest.WantErr(t, "DeleteProviderProfile(github)", err, codes.FailedPrecondition, "provider profile 'github' is managed by source 'builtin' and cannot be deleted")
	_, err = svc.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Id: "acme"})
	apitest.WantErr(t, "DeleteProviderProfile from the platform scope", err, codes.NotFound, "provider profile not found")
	if _, err := env.Engine.Delete(ctx, "team-a", "sb"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Workspace: "team-a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if d, err := svc.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Workspace: "team-a", Id: "acme"}); err != nil || !d.GetDeleted() {
		t.Errorf("DeleteProviderProfile = %v, %v", d, err)
	}

	// Platform profiles are visible in every workspace.
	if r := imp("", acme("shared")); !r.GetImported() || r.GetProfiles()[0].GetScope() != "platform" {
		t.Fatalf("platform import = %v", r)
	}
	for _, ws := range []string{"", "team-a"} {
		l, err := svc.ListProviderProfiles(ctx, &openshellv1.ListProviderProfilesRequest{Workspace: ws, Limit: 1000})
		if err != nil || !strings.Contains(fmt.Sprint(l.GetProfiles()), `id:"shared"`) {
			t.Errorf("ListProviderProfiles(%q) lacks the platform profile: %v", ws, err)
		}
	}
	if w := imp("team-a", acme("shared")); !w.GetImported() || !strings.Contains(diagTexts(w.GetDiagnostics()), "warning: profile 'shared' shadows a platform-scoped profile in this workspace") {
		t.Errorf("shadowing import = %v", w)
	}
}

// TestImportRacesWorkspaceDelete is the regression test for profiles
// imported while their workspace was being deleted: the check before the
// insert passed, the workspace turned TERMINATING before the rows landed,
// and the profiles outlived it (a workspace created again under the name
// would inherit them). The import re-checks after its inserts and takes
// them back.
func TestImportRacesWorkspaceDelete(t *testing.T) {
	env := apitest.NewEnv(t)
	apitest.CreateWorkspace(t, env.Store, "doomed")
	hs := &hookStore{Store: env.Store, objType: domain.TypeProviderProfile}
	hs.hook = func() { markTerminating(t, env.Store, "doomed") }
	provs := domain.NewStore(domain.Options{Objects: hs})
	svc := providers.New(providers.Options{Engine: env.Engine, Authz: env.Authz(false), Providers: provs})
	_, err := svc.ImportProviderProfiles(t.Context(), &openshellv1.ImportProviderProfilesRequest{Workspace: "doomed",
		Profiles: []*openshellv1.ProviderProfileImportItem{acme("acme")}})
	apitest.WantErr(t, "ImportProviderProfiles", err, codes.FailedPrecondition, `workspace "doomed" is being deleted`)
	if ps, err := provs.Profiles(t.Context(), "doomed"); err != nil || len(ps) != len(profiles.Builtin().IDs()) {
		t.Fatalf("profiles left in the terminating workspace: %d user profiles, %v", len(ps)-len(profiles.Builtin().IDs()), err)
	}
}
