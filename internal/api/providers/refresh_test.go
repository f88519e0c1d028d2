package providers_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/providers"
	"github.com/openshell-go/openshell/internal/credentials"
	domain "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
)

const (
	refreshTokenGrant = openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_REFRESH_TOKEN
	clientCredsGrant  = openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_CLIENT_CREDENTIALS
)

// tokenServer is a local OAuth2 token endpoint: client "cid"/"csecret";
// refresh_token grants need the refresh token it issued last (first
// "rt-0") and rotate it; it answers 400 invalid_grant while fail is set.
type tokenServer struct {
	mu      sync.Mutex
	fail    bool
	refresh string
	n       int
	url     string
}

func newTokenServer(t *testing.T) *tokenServer {
	ts := &tokenServer{refresh: "rt-0"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		_ = r.ParseForm()
		w.Header().Set("Content-Type", "application/json")
		deny := func() {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant"})
		}
		if ts.fail || r.Form.Get("client_id") != "cid" || r.Form.Get("client_secret") != "csecret" {
			deny()
			return
		}
		ts.n++
		resp := map[string]any{"token_type": "bearer", "expires_in": 600}
		switch r.Form.Get("grant_type") {
		case "refresh_token":
			if r.Form.Get("refresh_token") != ts.refresh {
				deny()
				return
			}
			ts.refresh = "rt-" + strconv.Itoa(ts.n)
			resp["access_token"], resp["refresh_token"] = "at-"+strconv.Itoa(ts.n), ts.refresh
		case "client_credentials":
			resp["access_token"] = "cc-" + strconv.Itoa(ts.n)
		default:
			deny()
			return
		}
		_ = json.NewEncoder(w).Encode(resp)
	}))
	t.Cleanup(srv.Close)
	ts.url = srv.URL + "/token"
	return ts
}

// oauthProfile is a user profile whose credential SVC_TOKEN is refreshed
// at tokenURL.
func oauthProfile(tokenURL string) *openshellv1.ProviderProfileImportItem {
	return &openshellv1.ProviderProfileImportItem{Profile: &openshellv1.ProviderProfile{
		Id: "oauthsvc",
		Credentials: []*openshellv1.ProviderProfileCredential{{Name: "token", EnvVars: []string{"SVC_TOKEN", "SVC_TOKEN2"},
			Refresh: &openshellv1.ProviderCredentialRefresh{TokenUrl: tokenURL, Scopes: []string{"read"}}}},
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.svc.test", Port: 443}},
	}}
}

// TestRefresh: against a local OAuth2 token server, a configured refresh
// keeps its secret material sealed, rotation swaps in the minted token
// and its expiry and follows the rotated refresh token, client
// credentials work too, a failed refresh revokes the current value, and
// delete removes the refresh (also with its provider).
func TestRefresh(t *testing.T) {
	env := apitest.NewEnv(t)
	svc := newService(env, false)
	ctx := t.Context()
	ts := newTokenServer(t)
	if r, err := svc.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: "default",
		Profiles: []*openshellv1.ProviderProfileImportItem{oauthProfile(ts.url)}}); err != nil || !r.GetImported() {
		t.Fatalf("import: %v, %v", r, err)
	}
	for _, name := range []string{"svc", "cc"} {
		if _, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
			Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "oauthsvc", Credentials: map[string]string{"SVC_TOKEN": "initial"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: github("gh", "s")}); err != nil {
		t.Fatal(err)
	}
	material := map[string]string{"client_id": "cid", "client_secret": "csecret", "refresh_token": "rt-0"}
	configure := func(provider string, strategy openshellv1.ProviderCredentialRefreshStrategy, key string, m map[string]string) (*openshellv1.ConfigureProviderRefreshResponse, error) {
		return svc.ConfigureProviderRefresh(ctx, &openshellv1.ConfigureProviderRefreshRequest{Provider: provider, CredentialKey: key, Strategy: strategy, Material: m})
	}
	for _, tc := range []struct {
		name, provider, key string
		strategy            openshellv1.ProviderCredentialRefreshStrategy
		m                   map[string]string
		code                codes.Code
		msg                 string
	}{
		{"no strategy", "svc", "SVC_TOKEN", 0, material, codes.InvalidArgument, "refresh strategy is required"},
		{"static", "svc", "SVC_TOKEN", openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_STATIC, material, codes.InvalidArgument,
			"refresh strategy 'static' is not gateway-mintable; update current credentials with provider update instead"},
		{"token url in material", "svc", "SVC_TOKEN", refreshTokenGrant, map[string]string{"client_id": "cid", "refresh_token": "r", "token_url": "https://evil.test/token"}, codes.InvalidArgument,
			"refresh token endpoints must be defined by the provider profile, not material"},
		{"missing refresh token", "svc", "SVC_TOKEN", refreshTokenGrant, map[string]string{"client_id": "cid"}, codes.InvalidArgument, "refresh_token material is required"},
		{"bad key", "svc", "not-env", refreshTokenGrant, material, codes.InvalidArgument, "credential_key must be a valid environment variable name"},
		{"no token endpoint", "gh", "GITHUB_TOKEN", clientCredsGrant, material, codes.FailedPrecondition, "provider 'gh' profile defines no refresh token endpoint for credential 'GITHUB_TOKEN'"},
		{"no provider", "nope", "SVC_TOKEN", refreshTokenGrant, material, codes.NotFound, "provider 'nope' not found"},
	} {
		_, err := configure(tc.provider, tc.strategy, tc.key, tc.m)
		apitest.WantErr(t, tc.name, err, tc.code, tc.msg)
	}

	c, err := configure("svc", refreshTokenGrant, "SVC_TOKEN", material)
	if err != nil || c.GetStatus().GetStatus() != "configured" || c.GetStatus().GetProviderName() != "svc" {
		t.Fatalf("configure = %v, %v", c, err)
	}
	// The refresh material is a separate object; its secrets are sealed.
	p, err := env.Providers.Get(ctx, "default", "svc")
	if err != nil {
		t.Fatal(err)
	}
	st := &openshellv1.StoredProviderCredentialRefreshState{}
	if err := env.Store.GetByName(ctx, domain.TypeProviderRefresh, "default", p.GetMetadata().GetId()+".SVC_TOKEN", st); err != nil {
		t.Fatalf("refresh state object: %v", err)
	}
	raw, _ := proto.Marshal(st)
	if strings.Contains(string(raw), "csecret") || strings.Contains(string(raw), "rt-0") || st.GetMaterial()["client_id"] != "cid" || len(st.GetSecretMaterialHandles()) != 2 {
		t.Errorf("stored refresh state: secrets in plaintext %v, client_id inline %v, %d sealed", strings.Contains(string(raw), "csecret") || strings.Contains(string(raw), "rt-0"),
			st.GetMaterial()["client_id"] == "cid", len(st.GetSecretMaterialHandles()))
	}

	value := func(name string) (string, int64, error) {
		p, err := env.Providers.Get(ctx, "default", name)
		if err != nil {
			t.Fatal(err)
		}
		v, err := env.Providers.Resolve(p, "SVC_TOKEN")
		return v, p.GetCredentialExpiresAtMs()["SVC_TOKEN"], err
	}
	rotate := func(name string) (*openshellv1.RotateProviderCredentialResponse, error) {
		return svc.RotateProviderCredential(ctx, &openshellv1.RotateProviderCredentialRequest{Provider: name, CredentialKey: "SVC_TOKEN"})
	}
	for _, want := range []string{"at-1", "at-2"} { // the second needs the refresh token rotated by the first
		r, err := rotate("svc")
		if err != nil || r.GetStatus().GetStatus() != "refreshed" {
			t.Fatalf("rotate = %v, %v", r, err)
		}
		v, exp, err := value("svc")
		if err != nil || v != want || exp != r.GetStatus().GetExpiresAtMs() || time.Until(time.UnixMilli(exp)) < 9*time.Minute {
			t.Errorf("after rotation: value %q (want %q), expiry %d (status %d), %v", v, want, exp, r.GetStatus().GetExpiresAtMs(), err)
		}
	}
	if _, err := configure("cc", clientCredsGrant, "SVC_TOKEN", map[string]string{"client_id": "cid", "client_secret": "csecret"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rotate("cc"); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := value("cc"); v != "cc-3" {
		t.Errorf("client credentials value = %q, want cc-3", v)
	}

	s, err := svc.GetProviderRefreshStatus(ctx, &openshellv1.GetProviderRefreshStatusRequest{Provider: "svc"})
	if err != nil || len(s.GetCredentials()) != 1 || s.GetCredentials()[0].GetStatus() != "refreshed" || s.GetCredentials()[0].GetLastRefreshAtMs() == 0 {
		t.Errorf("status = %v, %v", s, err)
	}

	ts.mu.Lock()
	ts.fail = true
	ts.mu.Unlock()
	_, err = rotate("svc")
	apitest.WantErr(t, "failed rotation", err, codes.FailedPrecondition, "credential 'SVC_TOKEN' of provider 'svc' was revoked: token endpoint returned HTTP 400 (invalid_grant)")
	if v, _, err := value("svc"); err == nil || v != "" {
		t.Errorf("after a failed refresh the previous value still resolves")
	}
	s, _ = svc.GetProviderRefreshStatus(ctx, &openshellv1.GetProviderRefreshStatusRequest{Provider: "svc", CredentialKey: "SVC_TOKEN"})
	if len(s.GetCredentials()) != 1 || s.GetCredentials()[0].GetStatus() != "error" || !strings.Contains(s.GetCredentials()[0].GetLastError(), "invalid_grant") {
		t.Errorf("status after failure = %v", s)
	}

	del := func(name string) bool {
		d, err := svc.DeleteProviderRefresh(ctx, &openshellv1.DeleteProviderRefreshRequest{Provider: name, CredentialKey: "SVC_TOKEN"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetDeleted()
	}
	// The refresh-owned expiry goes with the refresh.
	ts.mu.Lock()
	ts.fail = false
	ts.mu.Unlock()
	if _, err := rotate("cc"); err != nil {
		t.Fatal(err)
	}
	if !del("cc") {
		t.Fatal("DeleteProviderRefresh(cc) deleted nothing")
	}
	if _, exp, _ := value("cc"); exp != 0 {
		t.Errorf("expiry %d left after deleting the refresh that set it", exp)
	}
	if !del("svc") || del("svc") {
		t.Error("DeleteProviderRefresh did not delete exactly once")
	}
	_, err = rotate("svc")
	apitest.WantErr(t, "rotate after delete", err, codes.NotFound, "provider refresh state not found")
	if _, err := svc.DeleteProvider(ctx, &openshellv1.DeleteProviderRequest{Name: "cc"}); err != nil {
		t.Fatal(err)
	}
	if n, err := env.Store.List(ctx, domain.TypeProviderRefresh, storeAll()); err != nil || len(n) != 0 {
		t.Errorf("refresh states left after their providers' deletion: %d, %v", len(n), err)
	}
}

// TestRefreshAuthorization: refresh status needs the user role, the other
// refresh RPCs the admin role of the workspace.
func TestRefreshAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	if _, err := f.Providers.Create(t.Context(), "team-a", github("gh", "secret")); err != nil {
		t.Fatal(err)
	}
	calls := []apitest.Call{
		{Name: "GetProviderRefreshStatus", Do: func(ctx context.Context) error {
			_, err := svc.GetProviderRefreshStatus(ctx, &openshellv1.GetProviderRefreshStatusRequest{Workspace: "team-a", Provider: "gh"})
			return err
		}},
		{Name: "ConfigureProviderRefresh", Do: func(ctx context.Context) error {
			_, err := svc.ConfigureProviderRefresh(ctx, &openshellv1.ConfigureProviderRefreshRequest{Workspace: "team-a", Provider: "gh", CredentialKey: "GITHUB_TOKEN",
				Strategy: clientCredsGrant, Material: map[string]string{"client_id": "c", "client_secret": "s"}})
			return err
		}},
		{Name: "RotateProviderCredential", Do: func(ctx context.Context) error {
			_, err := svc.RotateProviderCredential(ctx, &openshellv1.RotateProviderCredentialRequest{Workspace: "team-a", Provider: "gh", CredentialKey: "GITHUB_TOKEN"})
			return err
		}},
		{Name: "DeleteProviderRefresh", Do: func(ctx context.Context) error {
			_, err := svc.DeleteProviderRefresh(ctx, &openshellv1.DeleteProviderRefreshRequest{Workspace: "team-a", Provider: "gh", CredentialKey: "GITHUB_TOKEN"})
			return err
		}},
	}
	const (
		ok = codes.OK
		nf = codes.NotFound
		fp = codes.FailedPrecondition
		pd = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, fp, nf, ok}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, fp, nf, ok}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, fp, nf, ok}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, pd, pd, pd}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{pd, pd, pd, pd}},
		{Name: "sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{pd, pd, pd, pd}},
	})
}

func storeAll() store.ListOptions {
	return store.ListOptions{AllWorkspaces: true, Limit: store.MaxLimit}
}

// TestRefreshDue: the background refresher mints a refreshed credential
// once its next_refresh_at_ms has come and leaves others alone; a failed
// mint revokes the value and is retried a minute later, and the retry
// restores a value.
func TestRefreshDue(t *testing.T) {
	env := apitest.NewEnv(t)
	kr, err := credentials.LoadOrCreateKEK(t.TempDir() + "/kek")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	provs := domain.NewStore(domain.Options{Objects: env.Store, Keyring: kr, Now: clock})
	svc := providers.New(providers.Options{Engine: env.Engine, Authz: env.Authz(false), Providers: provs})
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	ts := newTokenServer(t)
	if r, err := svc.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: "default",
		Profiles: []*openshellv1.ProviderProfileImportItem{oauthProfile(ts.url)}}); err != nil || !r.GetImported() {
		t.Fatalf("import: %v, %v", r, err)
	}
	if _, err := svc.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "svc"}, Type: "oauthsvc", Credentials: map[string]string{"SVC_TOKEN": "initial"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ConfigureProviderRefresh(ctx, &openshellv1.ConfigureProviderRefreshRequest{Provider: "svc", CredentialKey: "SVC_TOKEN",
		Strategy: refreshTokenGrant, Material: map[string]string{"client_id": "cid", "client_secret": "csecret", "refresh_token": "rt-0", "refresh_before_seconds": "60"}}); err != nil {
		t.Fatal(err)
	}
	value := func() string {
		p, err := provs.Get(ctx, "default", "svc")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := provs.Resolve(p, "SVC_TOKEN")
		return v
	}
	due := func() int {
		t.Helper()
		n, err := provs.RefreshDue(ctx, log)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := due(); n != 0 || value() != "initial" {
		t.Fatalf("a configured, never minted refresh was minted by the refresher (%d)", n)
	}
	if _, err := svc.RotateProviderCredential(ctx, &openshellv1.RotateProviderCredentialRequest{Provider: "svc", CredentialKey: "SVC_TOKEN"}); err != nil {
		t.Fatal(err)
	}
	if n := due(); n != 0 || value() != "at-1" {
		t.Fatalf("a fresh credential was minted again (%d, %q)", n, value())
	}
	advance(9*time.Minute + time.Second) // 60 s before the 10 min expiry
	if n := due(); n != 1 || value() != "at-2" {
		t.Fatalf("due refresh: minted %d, value %q; want at-2", n, value())
	}
	advance(10 * time.Minute)
	ts.mu.Lock()
	ts.fail = true
	ts.mu.Unlock()
	if n := due(); n != 0 || value() != "" {
		t.Fatalf("failed refresh: minted %d, value %q; want it revoked", n, value())
	}
	ts.mu.Lock()
	ts.fail = false
	ts.mu.Unlock()
	if n := due(); n != 0 {
		t.Fatalf("the failed refresh was retried at once (%d)", n)
	}
	advance(time.Minute + time.Second)
	if n := due(); n != 1 || value() != "at-3" {
		t.Fatalf("retry: minted %d, value %q; want at-3", n, value())
	}
}
