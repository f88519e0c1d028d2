package providers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store/open"
)

// TestRewrapRefreshMaterial is the regression test for refresh material
// left under a previous KEK by RewrapAll: once the previous key was
// dropped, the sealed client secret could not be opened and every
// refresh failed. RewrapAll now rewraps refresh states too.
func TestRewrapRefreshMaterial(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		if r.Form.Get("client_secret") != "csecret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "minted", "expires_in": 600})
	}))
	t.Cleanup(srv.Close)
	st, err := open.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "gateway.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := t.Context()
	old := keyring(t)
	before := providers.NewStore(providers.Options{Objects: st, Keyring: old})
	if _, diags, err := before.ImportProfiles(ctx, "default", []*openshellv1.ProviderProfileImportItem{{Profile: &openshellv1.ProviderProfile{
		Id: "svc", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.svc.test", Port: 443}},
		Credentials: []*openshellv1.ProviderProfileCredential{{Name: "token", EnvVars: []string{"SVC_TOKEN"}, Refresh: &openshellv1.ProviderCredentialRefresh{TokenUrl: srv.URL}}},
	}}}); err != nil || providers.HasErrors(diags) {
		t.Fatalf("import: %v %v", diags, err)
	}
	if _, err := before.Create(ctx, "default", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "p"}, Type: "svc", Credentials: map[string]string{"SVC_TOKEN": "x"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := before.ConfigureRefresh(ctx, "default", &openshellv1.ConfigureProviderRefreshRequest{Provider: "p", CredentialKey: "SVC_TOKEN",
		Strategy: openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_CLIENT_CREDENTIALS,
		Material: map[string]string{"client_id": "cid", "client_secret": "csecret"}}); err != nil {
		t.Fatal(err)
	}
	cur := keyring(t)
	n, err := providers.NewStore(providers.Options{Objects: st, Keyring: cur.WithPrevious(old)}).RewrapAll(ctx)
	if err != nil || n != 2 {
		t.Fatalf("RewrapAll = %d, %v; want the provider and its refresh state", n, err)
	}
	after := providers.NewStore(providers.Options{Objects: st, Keyring: cur})
	if s, err := after.RotateCredential(ctx, "default", "p", "SVC_TOKEN"); err != nil || s.GetStatus() != "refreshed" {
		t.Fatalf("rotation with the new KEK only = %v, %v", s, err)
	}
}
