package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProviderProfileRefreshCommandsRealGateway drives 'provider profile'
// and 'provider refresh' against the real gateway and a local OAuth2
// token endpoint: a built-in profile exports, a custom profile (with the
// endpoint's refresh URL) lints, imports, updates from its export and is
// refused while a provider uses it; refresh configure / rotate / status /
// delete work and print no material or value.
func TestProviderProfileRefreshCommandsRealGateway(t *testing.T) {
	tokens := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		if r.Form.Get("client_secret") != "cli-client-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "cli-minted-token", "expires_in": 600})
	}))
	t.Cleanup(tokens.Close)
	tt, _ := realGatewayTester(t)
	tt.env["SVC_CLIENT_SECRET"] = "cli-client-secret"
	run := func(args ...string) result {
		t.Helper()
		r := tt.run(args...)
		for _, s := range []string{"cli-client-secret", "cli-minted-token"} {
			if strings.Contains(r.stdout+r.stderr, s) || (r.err != nil && strings.Contains(r.err.Error(), s)) {
				t.Errorf("openshell %s printed a secret", strings.Join(args, " "))
			}
		}
		return r
	}
	must := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.err != nil {
			t.Fatalf("openshell %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
		}
		return r.stdout
	}

	if out := must("provider", "profile", "export", "github"); !strings.Contains(out, "id: github") || !strings.Contains(out, "host: api.github.com") {
		t.Errorf("export github = %s", out)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	profile := `id: svc
display_name: Service
credentials:
- name: token
  env_vars: [SVC_TOKEN]
  refresh: {token_url: "` + tokens.URL + `/token"}
endpoints:
- {host: api.svc.test, port: 443, protocol: rest, access: read-only}
`
	if err := os.WriteFile(file, []byte(profile), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("id: Not_Kebab\ncredentials: [{name: t, env_vars: [BAD-ENV]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run("provider", "profile", "lint", "-f", bad); r.err == nil || !strings.Contains(r.stderr, "error: ") || !strings.Contains(r.stderr, "kebab-case") {
		t.Errorf("lint of a bad profile = %v, stderr %q", r.err, r.stderr)
	}
	if out := must("provider", "profile", "lint", "-f", file); out != "1 profile(s) valid\n" {
		t.Errorf("lint = %q", out)
	}
	if r := run("provider", "profile", "import", "--from", filepath.Join(dir, "none-such")); r.code() != 2 {
		t.Errorf("import from a missing directory = %v, want a usage error", r.err)
	}
	ws := []string{"--workspace", "default", "provider", "profile"}
	if out := must(append(ws, "import", "-f", file)...); out != "Imported provider profile svc\n" {
		t.Errorf("import = %q", out)
	}
	if r := run(append(ws, "import", "-f", file)...); r.err == nil || !strings.Contains(r.stderr, "custom provider profile 'svc' already exists") {
		t.Errorf("import again = %v, stderr %q", r.err, r.stderr)
	}
	exported := must(append(ws, "export", "svc")...)
	if !strings.Contains(exported, "resource_version:") {
		t.Fatalf("export of a custom profile lacks its resource_version:\n%s", exported)
	}
	edited := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(edited, []byte(strings.Replace(exported, "display_name: Service", "display_name: Service v2", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := must(append(ws, "update", "svc", "-f", edited)...); out != "Updated provider profile svc\n" {
		t.Errorf("update = %q", out)
	}
	if r := run(append(ws, "update", "svc", "-f", edited)...); r.err == nil || !strings.Contains(r.err.Error(), "modified concurrently") {
		t.Errorf("update from a stale export = %v", r.err)
	}

	must("provider", "create", "svcp", "--type", "svc", "--credential", "SVC_TOKEN=initial-token")
	if r := run(append(ws, "delete", "svc")...); r.err == nil || !strings.Contains(r.err.Error(), "in use by providers: default/svcp") {
		t.Errorf("delete of a used profile = %v", r.err)
	}
	if out := must("provider", "refresh", "status", "svcp"); out != "No refresh configurations found for provider 'svcp'.\n" {
		t.Errorf("status before configure = %q", out)
	}
	must("provider", "refresh", "configure", "svcp", "--credential-key", "SVC_TOKEN", "--strategy", "oauth2-client-credentials",
		"--material", "client_id=cli", "--secret-material-env", "client_secret=SVC_CLIENT_SECRET")
	if out := must("provider", "refresh", "rotate", "svcp", "--credential-key", "SVC_TOKEN"); !strings.HasPrefix(out, "Rotated SVC_TOKEN of provider svcp (expires ") {
		t.Errorf("rotate = %q", out)
	}
	out := squash(must("provider", "refresh", "status", "svcp"))
	if !strings.Contains(out, "svcp SVC_TOKEN oauth2_client_credentials refreshed") {
		t.Errorf("status = %q", out)
	}
	if out := must("provider", "refresh", "delete", "svcp", "--credential-key", "SVC_TOKEN"); out != "Deleted refresh of SVC_TOKEN for provider svcp\n" {
		t.Errorf("refresh delete = %q", out)
	}
	must("provider", "delete", "svcp")
	if out := must(append(ws, "delete", "svc")...); out != "Deleted provider profile svc\n" {
		t.Errorf("profile delete = %q", out)
	}
}
