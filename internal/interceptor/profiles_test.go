package interceptor

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store/open"
)

const acmeProfiles = `[{"id":"acme-api","displayName":"Acme Material","category":"PROVIDER_PROFILE_CATEGORY_OTHER",
"credentials":[{"name":"api_key","envVars":["ACME_API_KEY"],"required":true}],
"endpoints":[{"host":"api.acme-material.example","port":443}]}]`

func providerStore(t *testing.T) *providers.Store {
	t.Helper()
	st, err := open.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "gateway.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	k, err := credentials.LoadOrCreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	return providers.NewStore(providers.Options{Objects: st, Keyring: k})
}

// catalogStore starts an interceptor "catalog" serving profiles (a JSON
// array) and returns a provider store reading srcs, and the interceptor.
func catalogStore(t *testing.T, profiles string, srcs ...ProfileSourceConfig) (*providers.Store, *fake) {
	t.Helper()
	f := startFake(t, `{"name":"catalog","providerProfiles":true}`, "allow", "", "-profiles", profiles)
	ps, err := ProfileSources(srcs, start(t, config("catalog", f)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := providerStore(t)
	s.SetProfileSources(ps)
	return s, f
}

// TestProfileSourceOncePerRequest: a captured catalog fetches each source
// once however many lookups the request makes; the next capture fetches
// again; the debug line has the counts and no profile material.
func TestProfileSourceOncePerRequest(t *testing.T) {
	f := startFake(t, `{"name":"catalog","providerProfiles":true}`, "allow", "", "-profiles", acmeProfiles, "-revision", "r7")
	rt := start(t, config("catalog", f))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ps, err := ProfileSources([]ProfileSourceConfig{{Type: "builtin"}, {Type: "user"}, {Type: "interceptor", Name: "catalog"}}, rt, log)
	if err != nil {
		t.Fatal(err)
	}
	s := providerStore(t)
	s.SetProfileSources(ps)
	ctx, err := s.CaptureProfiles(t.Context())
	if err != nil {
		t.Fatalf("CaptureProfiles: %v", err)
	}
	for range 3 {
		if _, err := s.Profile(ctx, "", "acme-api"); err != nil {
			t.Fatalf("Profile(acme-api): %v", err)
		}
	}
	if _, err := s.Create(ctx, "", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "acme"}, Type: "acme-api",
		Credentials: map[string]string{"ACME_API_KEY": "acme-unit-secret"}}); err != nil {
		t.Fatalf("Create(acme-api): %v", err)
	}
	if n := f.snapshots(t); n != 1 {
		t.Errorf("SnapshotProviderProfiles calls within one request = %d, want 1", n)
	}
	if _, err := s.Profile(t.Context(), "", "acme-api"); err != nil {
		t.Fatal(err)
	}
	if n := f.snapshots(t); n != 2 {
		t.Errorf("SnapshotProviderProfiles calls after a second request = %d, want 2", n)
	}
	out := logs.String()
	if !strings.Contains(out, "source_fetch_count=3") || !strings.Contains(out, "catalog_revision=sha256:") {
		t.Errorf("debug log lacks the revision or the fetch count:\n%s", out)
	}
	for _, m := range []string{"acme", "ACME", "r7"} {
		if strings.Contains(out, m) {
			t.Errorf("debug log contains profile material %q:\n%s", m, out)
		}
	}
}

// TestProfileSourceDuplicateWithinSource: one source serving an id twice
// (after normalization) fails every lookup.
func TestProfileSourceDuplicateWithinSource(t *testing.T) {
	two := strings.Replace(acmeProfiles, "}]}]", "}]},"+strings.TrimPrefix(strings.Replace(acmeProfiles, `"acme-api"`, `" ACME-API "`, 1), "["), 1)
	s, _ := catalogStore(t, two, ProfileSourceConfig{Type: "interceptor", Name: "catalog"})
	_, err := s.Profile(t.Context(), "", "acme-api")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "duplicate provider profile id 'acme-api' within source 'catalog'") {
		t.Fatalf("Profile = %v, want FailedPrecondition naming the duplicate", err)
	}
}

// TestProfileSourcesRefused: an interceptor without provider_profiles in
// its manifest, or one not configured, is not a profile source.
func TestProfileSourcesRefused(t *testing.T) {
	f := startFake(t, `{"name":"plain"}`, "allow", "")
	rt := start(t, config("plain", f))
	for _, name := range []string{"plain", "missing"} {
		_, err := ProfileSources([]ProfileSourceConfig{{Type: "interceptor", Name: name}}, rt, nil)
		want := "provider profile source interceptor '" + name + "' is not configured or does not advertise provider_profiles"
		if err == nil || err.Error() != want {
			t.Errorf("ProfileSources(%s) = %v, want %q", name, err, want)
		}
	}
	if _, err := ProfileSources([]ProfileSourceConfig{{Type: "interceptor", Name: "x"}}, nil, nil); err == nil {
		t.Error("ProfileSources without interceptors accepted an interceptor source")
	}
}

func TestParseProfileSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  []any
		want string // "" = valid
	}{
		{"default order", []any{map[string]any{"type": "builtin"}, map[string]any{"type": "user"}}, ""},
		{"interceptor", []any{map[string]any{"type": "interceptor", "name": "catalog"}}, ""},
		{"empty", []any{}, "provider_profile_sources must contain at least one source"},
		{"unknown type", []any{map[string]any{"type": "remote"}}, `[0]: unknown source type "remote" (builtin, user or interceptor)`},
		{"unknown key", []any{map[string]any{"type": "builtin", "path": "x"}}, `[0]: unknown key "path"`},
		{"no name", []any{map[string]any{"type": "interceptor"}}, "[0]: provider profile interceptor source name must not be empty"},
		{"name on builtin", []any{map[string]any{"type": "builtin", "name": "x"}}, `[0]: name is only for type "interceptor"`},
		{"not a table", []any{"builtin"}, `[0]: a source is a table such as { type = "builtin" }`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProfileSources(tc.raw)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("ParseProfileSources = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestProfileSourceDuplicateWithUser: a stored user profile with an id the
// interceptor also serves fails lookups instead of one shadowing the
// other; without the interceptor the same store works as before.
func TestProfileSourceDuplicateWithUser(t *testing.T) {
	s := providerStore(t)
	_, diags, err := s.ImportProfiles(t.Context(), "team-a", []*openshellv1.ProviderProfileImportItem{{Source: "acme.yaml", Profile: &openshellv1.ProviderProfile{
		Id: "acme-api", DisplayName: "Acme", Category: openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_OTHER,
		Credentials: []*openshellv1.ProviderProfileCredential{{Name: "api_key", EnvVars: []string{"ACME_API_KEY"}}},
	}}})
	if err != nil || providers.HasErrors(diags) {
		t.Fatalf("ImportProfiles = %v %v", diags, err)
	}
	if _, err := s.Profile(t.Context(), "team-a", "acme-api"); err != nil {
		t.Fatalf("Profile with the default sources: %v", err)
	}
	f := startFake(t, `{"name":"catalog","providerProfiles":true}`, "allow", "", "-profiles", acmeProfiles)
	ps, err := ProfileSources([]ProfileSourceConfig{{Type: "builtin"}, {Type: "user"}, {Type: "interceptor", Name: "catalog"}}, start(t, config("catalog", f)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetProfileSources(ps)
	_, err = s.Profile(t.Context(), "team-b", "github")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "duplicate provider profile id 'acme-api' across configured sources 'user' and 'catalog'") {
		t.Fatalf("Profile = %v, want FailedPrecondition naming both sources", err)
	}
}

// TestProfileSourceFailures: a failing snapshot, an invalid profile, an
// empty revision and an empty catalog each fail the lookup, and a source
// named twice is refused when the set is built.
func TestProfileSourceFailures(t *testing.T) {
	for _, tc := range []struct {
		name, behavior string
		args           []string
		want           error
		msg            string
	}{
		{"snapshot fails", "snapshot-fail", []string{"-profiles", acmeProfiles}, errdefs.ErrUnavailable, "provider profile source 'catalog' snapshot failed: rpc error: code = Unavailable desc = catalog backend down"},
		{"invalid env var", "allow", []string{"-profiles", strings.Replace(acmeProfiles, "ACME_API_KEY", "1BAD", 1)}, errdefs.ErrFailedPrecondition, "provider profile source 'catalog' is invalid: provider profile 'acme-api' credentials[0].env_vars"},
		{"invalid id", "allow", []string{"-profiles", strings.Replace(acmeProfiles, "acme-api", "acme_api", 1)}, errdefs.ErrFailedPrecondition, "provider profile 'acme_api' in source 'catalog' has invalid id"},
		{"empty revision", "allow", []string{"-profiles", acmeProfiles, "-revision", ""}, errdefs.ErrFailedPrecondition, "provider profile source 'catalog' returned an empty revision"},
		{"no profiles", "allow", nil, errdefs.ErrFailedPrecondition, "provider profile source 'catalog' returned no profiles"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, `{"name":"catalog","providerProfiles":true}`, tc.behavior, "", tc.args...)
			ps, err := ProfileSources([]ProfileSourceConfig{{Type: "builtin"}, {Type: "interceptor", Name: "catalog"}}, start(t, config("catalog", f)), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := providerStore(t)
			s.SetProfileSources(ps)
			_, err = s.Profile(t.Context(), "", "github")
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Profile = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
	_, err := ProfileSources([]ProfileSourceConfig{{Type: "builtin"}, {Type: "user"}, {Type: "builtin"}}, nil, nil)
	if want := "duplicate provider profile source 'builtin' in provider_profile_sources"; err == nil || err.Error() != want {
		t.Errorf("ProfileSources(builtin twice) = %v, want %q", err, want)
	}
}

// TestProfileSignatureNotVerified: configured interceptors are trusted
// sources: a profile whose signature annotations verify nothing is served
// as it is, annotations included.
func TestProfileSignatureNotVerified(t *testing.T) {
	signed := strings.Replace(acmeProfiles, `"displayName"`, `"annotations":{"openshell.nvidia.com/profile-signature":"not-a-signature","openshell.nvidia.com/profile-hash":"sha256:0000"},"displayName"`, 1)
	s, _ := catalogStore(t, signed, ProfileSourceConfig{Type: "interceptor", Name: "catalog"})
	p, err := s.Profile(t.Context(), "", "acme-api")
	if err != nil {
		t.Fatalf("Profile(acme-api) with an unverifiable signature annotation: %v", err)
	}
	if got := p.GetAnnotations()["openshell.nvidia.com/profile-signature"]; got != "not-a-signature" {
		t.Errorf("profile-signature annotation = %q, want it served as the interceptor sent it", got)
	}
}

// TestProfileRulesOneCatalog: deriving a sandbox's policy layers from two
// providers whose profiles an interceptor serves fetches that interceptor
// once: one captured catalog per request.
func TestProfileRulesOneCatalog(t *testing.T) {
	s, f := catalogStore(t, acmeProfiles, ProfileSourceConfig{Type: "builtin"}, ProfileSourceConfig{Type: "interceptor", Name: "catalog"})
	for _, name := range []string{"acme-a", "acme-b"} {
		if _, err := s.Create(t.Context(), "", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "acme-api",
			Credentials: map[string]string{"ACME_API_KEY": "acme-unit-secret"}}); err != nil {
			t.Fatalf("Create(%s): %v", name, err)
		}
	}
	before := f.snapshots(t)
	sb := &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Name: "sb"}, Spec: &openshellv1.SandboxSpec{Providers: []string{"acme-a", "acme-b"}}}
	rules, err := s.ProfileRules(t.Context(), sb)
	if err != nil {
		t.Fatalf("ProfileRules: %v", err)
	}
	if len(rules) != 2 {
		t.Errorf("ProfileRules = %d rules, want one per provider", len(rules))
	}
	if n := f.snapshots(t) - before; n != 1 {
		t.Errorf("SnapshotProviderProfiles calls for one policy derivation = %d, want 1", n)
	}
}
