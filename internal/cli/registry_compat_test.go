package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// openShellMeta reads metadata.json the way OpenShell's clients do: the Rust
// CLI's serde struct requires name, gateway_endpoint, is_remote and
// gateway_port (no defaults) and ignores unknown keys; the Python SDK fails
// with "metadata missing endpoint" without gateway_endpoint. It returns the
// fields and an error naming what OpenShell would reject.
func openShellMeta(b []byte) (map[string]any, error) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for key, typ := range map[string]string{"name": "string", "gateway_endpoint": "string", "is_remote": "bool", "gateway_port": "u16"} {
		v, ok := m[key]
		if !ok {
			return nil, fmt.Errorf("missing field `%s`", key)
		}
		switch typ {
		case "string":
			_, ok = v.(string)
		case "bool":
			_, ok = v.(bool)
		case "u16":
			f, isNum := v.(float64)
			ok = isNum && f >= 0 && f <= 65535 && f == float64(int(f))
		}
		if !ok {
			return nil, fmt.Errorf("field `%s`: want %s, got %v", key, typ, v)
		}
	}
	optional := []string{"remote_host", "resolved_host", "auth_mode", "edge_team_domain", "edge_auth_url",
		"oidc_issuer", "oidc_client_id", "oidc_audience", "oidc_scopes", "vm_driver_state_dir"}
	for _, key := range optional {
		if v, ok := m[key]; ok {
			if _, isString := v.(string); !isString {
				return nil, fmt.Errorf("field `%s`: want string, got %v", key, v)
			}
		}
	}
	if mode, ok := m["auth_mode"]; ok {
		switch mode {
		case "mtls", "plaintext", "oidc", "cloudflare_jwt":
		default:
			return nil, fmt.Errorf("auth_mode %q is not one of OpenShell's", mode)
		}
	}
	return m, nil
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// TestRegistryReadsOpenShellFiles: files as OpenShell's CLI writes them
// (serde_json pretty, no trailing newline, its mTLS layout) are listed and
// used by our CLI; OIDC and edge-JWT gateways are refused with a clear error
// instead of being dialed without credentials.
func TestRegistryReadsOpenShellFiles(t *testing.T) {
	tt := newTester(t)
	root := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell")
	copyTree(t, "testdata/registry/openshell", root)
	before := map[string][]byte{}
	for _, g := range []string{"remote-mtls", "local-plain", "k3s-managed", "oidc-gw", "edge-gw"} {
		b, err := os.ReadFile(filepath.Join(root, "gateways", g, "metadata.json"))
		if err != nil {
			t.Fatal(err)
		}
		before[g] = b
	}

	r := tt.run("gateway", "list")
	want := "ACTIVE   NAME          ENDPOINT                      AUTH             SOURCE\n" +
		"         edge-gw       https://edge.example.com      cloudflare_jwt   user\n" +
		"         k3s-managed   https://127.0.0.1:8080        mtls             user\n" +
		"         local-plain   http://127.0.0.1:8080         none             user\n" +
		"         oidc-gw       https://gw.corp.example:443   oidc             user\n" +
		"         remote-mtls   https://gw.example.com:8080   mtls             user\n"
	if diff := cmp.Diff(want, r.stdout); diff != "" || r.err != nil {
		t.Errorf("gateway list (-want +got):\n%s (err %v)", diff, r.err)
	}

	for _, tc := range []struct{ gw, endpoint, cert string }{
		{"remote-mtls", "https://gw.example.com:8080", filepath.Join(root, "gateways/remote-mtls/mtls/tls.crt")},
		{"k3s-managed", "https://127.0.0.1:8080", filepath.Join(root, "gateways/k3s-managed/mtls/tls.crt")},
		{"local-plain", "http://127.0.0.1:8080", ""},
	} {
		r := tt.run("--gateway", tc.gw, "gateway", "info", "-o", "json")
		var got map[string]any
		if r.err != nil || json.Unmarshal([]byte(r.stdout), &got) != nil {
			t.Fatalf("gateway info %s = %q (%v)", tc.gw, r.stdout, r.err)
		}
		if got["endpoint"] != tc.endpoint || got["client_cert"] != tc.cert {
			t.Errorf("%s resolved to %v with cert %v, want %s with %q", tc.gw, got["endpoint"], got["client_cert"], tc.endpoint, tc.cert)
		}
	}
	for gw, want := range map[string]string{
		"oidc-gw": `OIDC credentials for gateway "oidc-gw" are missing`,
		"edge-gw": `gateway "edge-gw" uses auth_mode "cloudflare_jwt", which this openshell does not support yet`,
	} {
		r := tt.run("--gateway", gw, "gateway", "info")
		if r.err == nil || !strings.Contains(r.err.Error(), want) {
			t.Errorf("%s: got %v, want a refusal containing %q", gw, r.err, want)
		}
	}
	// Reading never rewrites OpenShell's files.
	for g, b := range before {
		after, _ := os.ReadFile(filepath.Join(root, "gateways", g, "metadata.json"))
		if string(after) != string(b) {
			t.Errorf("%s/metadata.json was rewritten:\n%s", g, after)
		}
	}
}

// TestRegistryWritesOpenShellFormat: what 'gateway add' writes is read by
// OpenShell's reader, with the key values OpenShell's own 'gateway add'
// would write for such a gateway, and the mTLS files where OpenShell looks.
func TestRegistryWritesOpenShellFormat(t *testing.T) {
	tt := newTester(t)
	src := t.TempDir()
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		writeFile(t, filepath.Join(src, f), "PEM "+f)
	}
	adds := [][]string{
		{"gateway", "add", "prod", "--endpoint", "https://gw.example.com:17670",
			"--ca", filepath.Join(src, "ca.crt"), "--cert", filepath.Join(src, "tls.crt"), "--key", filepath.Join(src, "tls.key")},
		{"gateway", "add", "dev", "--endpoint", "http://127.0.0.1:17670"},
		{"gateway", "add", "lan", "--endpoint", "http://10.0.0.5:17670"},
		{"gateway", "add", "selfsigned", "--endpoint", "https://[::1]:17670", "--insecure"},
	}
	for _, args := range adds {
		if r := tt.run(args...); r.err != nil {
			t.Fatalf("%v: %v", args, r.err)
		}
	}
	root := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell")
	want := map[string]map[string]any{
		"prod":       {"name": "prod", "gateway_endpoint": "https://gw.example.com:17670", "is_remote": true, "gateway_port": float64(0), "auth_mode": "mtls"},
		"dev":        {"name": "dev", "gateway_endpoint": "http://127.0.0.1:17670", "is_remote": false, "gateway_port": float64(0), "auth_mode": "plaintext"},
		"lan":        {"name": "lan", "gateway_endpoint": "http://10.0.0.5:17670", "is_remote": true, "gateway_port": float64(0), "auth_mode": "plaintext"},
		"selfsigned": {"name": "selfsigned", "gateway_endpoint": "https://[::1]:17670", "is_remote": false, "gateway_port": float64(0), "auth_mode": "mtls", "insecure": true},
	}
	for name, w := range want {
		b, err := os.ReadFile(filepath.Join(root, "gateways", name, "metadata.json"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := openShellMeta(b)
		if err != nil {
			t.Errorf("OpenShell cannot read %s/metadata.json: %v\n%s", name, err, b)
			continue
		}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("%s/metadata.json (-want +got):\n%s", name, diff)
		}
	}
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		p := filepath.Join(root, "gateways/prod/mtls", f)
		if b, err := os.ReadFile(p); err != nil || string(b) != "PEM "+f {
			t.Errorf("%s = %q (%v)", p, b, err)
		}
	}
	// And back: the files we wrote are what we read.
	r := tt.run("--gateway", "prod", "gateway", "info", "-o", "json")
	if r.err != nil || !strings.Contains(r.stdout, `"endpoint": "https://gw.example.com:17670"`) {
		t.Errorf("gateway info prod = %q (%v)", r.stdout, r.err)
	}
}

// TestRegistryMigratesOpenShellGoFiles: a metadata.json written by an
// earlier openshell-go ({"name","endpoint","created_at","insecure"}) is read
// and rewritten in OpenShell's format (0600) in the user root; a legacy file
// in the read-only system root is read but left alone.
func TestRegistryMigratesOpenShellGoFiles(t *testing.T) {
	tt := newTester(t)
	legacy, err := os.ReadFile("testdata/registry/openshell-go-0/metadata.json")
	if err != nil {
		t.Fatal(err)
	}
	userFile := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell/gateways/old/metadata.json")
	sysFile := filepath.Join(tt.env["OPENSHELL_SYSTEM_GATEWAY_DIR"], "gateways/sysold/metadata.json")
	writeFile(t, userFile, string(legacy))
	writeFile(t, sysFile, `{"name":"sysold","endpoint":"http://127.0.0.1:17670","created_at":"2026-10-01T12:00:00Z"}`)

	r := tt.run("--gateway", "old", "gateway", "info", "-o", "json")
	if r.err != nil || !strings.Contains(r.stdout, `"endpoint": "https://gw.example.com:17670"`) || !strings.Contains(r.stdout, `"insecure": true`) {
		t.Fatalf("gateway info old = %q (%v)", r.stdout, r.err)
	}
	b, err := os.ReadFile(userFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := openShellMeta(b)
	if err != nil {
		t.Fatalf("migrated file is not readable by OpenShell: %v\n%s", err, b)
	}
	want := map[string]any{"name": "old", "gateway_endpoint": "https://gw.example.com:17670", "is_remote": true, "gateway_port": float64(0), "auth_mode": "mtls", "insecure": true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("migrated metadata.json (-want +got):\n%s", diff)
	}
	if m := mode(t, userFile); m != 0o600 {
		t.Errorf("migrated file mode %o, want 600", m)
	}

	r = tt.run("--gateway", "sysold", "gateway", "info", "-o", "json")
	if r.err != nil || !strings.Contains(r.stdout, `"endpoint": "http://127.0.0.1:17670"`) {
		t.Errorf("gateway info sysold = %q (%v)", r.stdout, r.err)
	}
	if b, _ := os.ReadFile(sysFile); !strings.Contains(string(b), `"endpoint"`) {
		t.Errorf("system file was rewritten: %s", b)
	}
}

func TestParseGatewayMetaRejectsFilesWithoutEndpoint(t *testing.T) {
	for _, in := range []string{`{}`, `{"name":"x","is_remote":false,"gateway_port":0}`} {
		if _, _, err := parseGatewayMeta([]byte(in)); err == nil || !strings.Contains(err.Error(), "missing gateway_endpoint") {
			t.Errorf("parseGatewayMeta(%s) = %v, want missing gateway_endpoint", in, err)
		}
	}
	m, _, err := parseGatewayMeta([]byte(`{"name":"e","gateway_endpoint":"https://e","is_remote":true,"gateway_port":0,"cf_team_domain":"t.example","cf_auth_url":"https://t.example/auth"}`))
	if err != nil || m.EdgeTeamDomain != "t.example" || m.EdgeAuthURL != "https://t.example/auth" {
		t.Errorf("cf_* aliases: %+v (%v)", m, err)
	}
}
