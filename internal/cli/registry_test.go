package cli

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestGatewayRegistryLifecycle(t *testing.T) {
	tt := newTester(t)
	src := t.TempDir()
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		writeFile(t, filepath.Join(src, f), "PEM "+f)
	}
	r := tt.run("gateway", "add", "prod", "--endpoint", "https://gw.example.com:17670",
		"--ca", filepath.Join(src, "ca.crt"), "--cert", filepath.Join(src, "tls.crt"), "--key", filepath.Join(src, "tls.key"))
	if r.err != nil {
		t.Fatalf("gateway add prod: %v", r.err)
	}
	if !strings.Contains(r.stdout, "selected") {
		t.Errorf("first add should select the gateway; stdout %q", r.stdout)
	}
	if r := tt.run("gateway", "add", "dev", "--endpoint", "http://127.0.0.1:17670"); r.err != nil {
		t.Fatalf("gateway add dev: %v", r.err)
	}

	root := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell")
	for _, d := range []string{root, root + "/gateways", root + "/gateways/prod", root + "/gateways/prod/mtls"} {
		if got := mode(t, d); got != 0o700 {
			t.Errorf("mode(%s) = %o, want 700", d, got)
		}
	}
	for _, f := range []string{"active_gateway", "gateways/prod/metadata.json", "gateways/prod/mtls/ca.crt", "gateways/prod/mtls/tls.crt", "gateways/prod/mtls/tls.key", "gateways/dev/metadata.json"} {
		if got := mode(t, filepath.Join(root, f)); got != 0o600 {
			t.Errorf("mode(%s) = %o, want 600", f, got)
		}
	}
	var meta gatewayMeta
	b, _ := os.ReadFile(filepath.Join(root, "gateways/prod/metadata.json"))
	if err := json.Unmarshal(b, &meta); err != nil || meta.Endpoint != "https://gw.example.com:17670" {
		t.Errorf("metadata.json = %s (%v)", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "gateways/prod/mtls/tls.key")); string(b) != "PEM tls.key" {
		t.Errorf("tls.key content = %q", b)
	}

	r = tt.run("gateway", "list")
	want := "ACTIVE   NAME   ENDPOINT                       AUTH   SOURCE\n" +
		"         dev    http://127.0.0.1:17670         none   user\n" +
		"*        prod   https://gw.example.com:17670   mtls   user\n"
	if diff := cmp.Diff(want, r.stdout); diff != "" || r.err != nil {
		t.Errorf("gateway list (-want +got):\n%s (err %v)", diff, r.err)
	}

	if r := tt.run("gateway", "select", "dev"); r.err != nil {
		t.Fatalf("select: %v", r.err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "active_gateway")); strings.TrimSpace(string(b)) != "dev" {
		t.Errorf("active_gateway = %q, want dev", b)
	}
	if r := tt.run("gateway", "select", "nope"); r.code() != 1 || !strings.Contains(r.err.Error(), `gateway "nope" is not registered`) {
		t.Errorf("select nope = %v (code %d)", r.err, r.code())
	}
	if r := tt.run("gateway", "add", "dev", "--endpoint", "http://x:1"); r.err == nil || !strings.Contains(r.err.Error(), "already registered") {
		t.Errorf("duplicate add = %v", r.err)
	}

	if r := tt.run("gateway", "remove", "dev"); r.err != nil {
		t.Fatalf("remove dev: %v", r.err)
	}
	if _, err := os.Stat(filepath.Join(root, "gateways/dev")); !os.IsNotExist(err) {
		t.Errorf("gateways/dev still exists: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "active_gateway")); !os.IsNotExist(err) {
		t.Errorf("active_gateway should go with the removed active gateway: %v", err)
	}
	r = tt.run("gateway", "list", "-o", "json")
	var views []gatewayView
	if err := json.Unmarshal([]byte(r.stdout), &views); err != nil || len(views) != 1 || views[0].Name != "prod" {
		t.Errorf("gateway list -o json = %s (%v)", r.stdout, err)
	}
}

func TestGatewayAddRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no endpoint", []string{"gateway", "add", "x"}, "--endpoint is required"},
		{"bad scheme", []string{"gateway", "add", "x", "--endpoint", "ftp://h:1"}, "scheme must be"},
		{"bad name", []string{"gateway", "add", "../x", "--endpoint", "http://h:1"}, "invalid gateway name"},
		{"insecure with certs", []string{"gateway", "add", "x", "--endpoint", "https://h:1", "--insecure", "--ca", "/dev/null"}, "cannot be combined"},
		{"cert without key", []string{"gateway", "add", "x", "--endpoint", "https://h:1", "--cert", "/dev/null"}, "go together"},
		{"relative unix", []string{"gateway", "add", "x", "--endpoint", "unix://rel/sock"}, "unix:///absolute/path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTester(t)
			r := tt.run(tc.args...)
			if r.code() != 2 || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("%v = %v (code %d), want usage error containing %q", tc.args, r.err, r.code(), tc.want)
			}
			if ents, _ := os.ReadDir(filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways")); len(ents) != 0 {
				t.Errorf("rejected add left %d entries behind", len(ents))
			}
		})
	}
	t.Run("missing ca file leaves nothing", func(t *testing.T) {
		tt := newTester(t)
		r := tt.run("gateway", "add", "x", "--endpoint", "https://h:1", "--ca", "/nonexistent/ca.crt")
		if r.code() != 1 {
			t.Fatalf("code = %d, want 1 (%v)", r.code(), r.err)
		}
		ents, _ := os.ReadDir(filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "gateways"))
		if len(ents) != 0 {
			t.Errorf("failed add left %v behind", ents)
		}
	})
}

func TestSystemGatewayRoot(t *testing.T) {
	tt := newTester(t)
	sys := tt.env["OPENSHELL_SYSTEM_GATEWAY_DIR"]
	writeFile(t, filepath.Join(sys, "gateways/corp/metadata.json"), `{"name":"corp","endpoint":"https://corp.example:17670"}`)
	writeFile(t, filepath.Join(sys, "active_gateway"), "corp\n")

	r := tt.run("gateway", "list")
	if r.err != nil || !strings.Contains(r.stdout, "*        corp   https://corp.example:17670   tls    system") {
		t.Errorf("gateway list = %q (%v)", r.stdout, r.err)
	}
	r = tt.run("gateway", "info")
	if r.err != nil || !strings.Contains(r.stdout, "https://corp.example:17670") || !strings.Contains(r.stdout, "active gateway") {
		t.Errorf("gateway info = %q (%v)", r.stdout, r.err)
	}
	r = tt.run("gateway", "remove", "corp")
	if r.code() != 1 || !strings.Contains(r.err.Error(), "system configuration") {
		t.Errorf("remove system entry = %v (code %d)", r.err, r.code())
	}
	if _, err := os.Stat(filepath.Join(sys, "gateways/corp/metadata.json")); err != nil {
		t.Errorf("system entry was touched: %v", err)
	}
	// A user entry of the same name shadows the system one and can be removed.
	if r := tt.run("gateway", "add", "corp", "--endpoint", "http://127.0.0.1:1"); r.err != nil {
		t.Fatalf("add shadowing user entry: %v", r.err)
	}
	if r := tt.run("gateway", "info", "corp"); !strings.Contains(r.stdout, "http://127.0.0.1:1") {
		t.Errorf("user entry should shadow system entry: %q", r.stdout)
	}
	if r := tt.run("gateway", "remove", "corp"); r.err != nil {
		t.Errorf("remove user entry: %v", r.err)
	}
	if r := tt.run("gateway", "info", "corp"); !strings.Contains(r.stdout, "https://corp.example:17670") {
		t.Errorf("system entry should be visible again: %q", r.stdout)
	}
}

func TestBadSystemGatewayDirWarns(t *testing.T) {
	for _, v := range []string{"", "relative/dir"} {
		t.Run(v, func(t *testing.T) {
			tt := newTester(t)
			tt.env["OPENSHELL_SYSTEM_GATEWAY_DIR"] = v
			r := tt.run("gateway", "list")
			if r.err != nil {
				t.Fatal(r.err)
			}
			want := "warning: ignoring OPENSHELL_SYSTEM_GATEWAY_DIR=" + `"` + v + `"` + ": it must be a non-empty absolute path; using /etc/openshell"
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr = %q, want %q", r.stderr, want)
			}
			reg := newRegistryFromEnv(func(k string) (string, bool) { x, ok := tt.env[k]; return x, ok }, &strings.Builder{})
			if reg.systemDir != DefaultSystemGatewayDir {
				t.Errorf("systemDir = %q, want %q", reg.systemDir, DefaultSystemGatewayDir)
			}
		})
	}
}

func TestResolveGatewayOrder(t *testing.T) {
	tt := newTester(t)
	if r := tt.run("gateway", "add", "one", "--endpoint", "http://10.0.0.1:1"); r.err != nil {
		t.Fatal(r.err)
	}
	if r := tt.run("gateway", "add", "two", "--endpoint", "http://10.0.0.2:2"); r.err != nil {
		t.Fatal(r.err)
	}
	tlsDir := t.TempDir()
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		setup    func(t *testing.T)
		want     string
		wantName string
	}{
		{name: "flag endpoint beats everything", args: []string{"--gateway-endpoint", "http://9.9.9.9:9", "--gateway", "two"}, env: map[string]string{"OPENSHELL_GATEWAY_ENDPOINT": "http://8.8.8.8:8"}, want: "http://9.9.9.9:9", wantName: "two"},
		{name: "env endpoint beats --gateway", args: []string{"--gateway", "two"}, env: map[string]string{"OPENSHELL_GATEWAY_ENDPOINT": "http://8.8.8.8:8"}, want: "http://8.8.8.8:8", wantName: "two"},
		{name: "--gateway beats active", args: []string{"--gateway", "two"}, want: "http://10.0.0.2:2", wantName: "two"},
		{name: "env gateway beats active", env: map[string]string{"OPENSHELL_GATEWAY": "two"}, want: "http://10.0.0.2:2", wantName: "two"},
		{name: "active gateway", want: "http://10.0.0.1:1", wantName: "one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				tt.env[k] = v
			}
			defer func() {
				for k := range tc.env {
					delete(tt.env, k)
				}
			}()
			r := tt.run(append(tc.args, "gateway", "info", "-o", "json")...)
			var got map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("gateway info: %v (%q, %v)", err, r.stdout, r.err)
			}
			if got["endpoint"] != tc.want || got["name"] != tc.wantName {
				t.Errorf("resolved %v/%v, want %v/%v", got["name"], got["endpoint"], tc.wantName, tc.want)
			}
		})
	}

	t.Run("nothing registered: plaintext local", func(t *testing.T) {
		tt := newTester(t)
		tt.env["OPENSHELL_LOCAL_TLS_DIR"] = tlsDir
		r := tt.run("gateway", "info", "-o", "json")
		if !strings.Contains(r.stdout, `"endpoint": "http://127.0.0.1:17670"`) || !strings.Contains(r.stdout, `"name": "local"`) {
			t.Errorf("gateway info = %s", r.stdout)
		}
	})
	t.Run("nothing registered: local TLS dir", func(t *testing.T) {
		tt := newTester(t)
		tt.env["OPENSHELL_LOCAL_TLS_DIR"] = tlsDir
		for _, f := range []string{"ca.crt", "client/tls.crt", "client/tls.key"} {
			writeFile(t, filepath.Join(tlsDir, f), "x")
		}
		r := tt.run("gateway", "info", "-o", "json")
		if !strings.Contains(r.stdout, `"endpoint": "https://127.0.0.1:17670"`) || !strings.Contains(r.stdout, filepath.Join(tlsDir, "client/tls.crt")) {
			t.Errorf("gateway info = %s", r.stdout)
		}
	})
	t.Run("default local TLS dir is under XDG_STATE_HOME", func(t *testing.T) {
		tt := newTester(t)
		for _, f := range []string{"ca.crt", "client/tls.crt", "client/tls.key"} {
			writeFile(t, filepath.Join(tt.env["XDG_STATE_HOME"], "openshell/tls", f), "x")
		}
		r := tt.run("gateway", "info", "-o", "json")
		if !strings.Contains(r.stdout, `"endpoint": "https://127.0.0.1:17670"`) {
			t.Errorf("gateway info = %s", r.stdout)
		}
	})
	t.Run("several registered, none active", func(t *testing.T) {
		tt2 := newTester(t)
		tt2.run("gateway", "add", "a", "--endpoint", "http://h:1")
		tt2.run("gateway", "add", "b", "--endpoint", "http://h:2")
		os.Remove(filepath.Join(tt2.env["XDG_CONFIG_HOME"], "openshell", "active_gateway"))
		r := tt2.run("gateway", "info")
		if r.err == nil || !strings.Contains(r.err.Error(), "none is selected") {
			t.Errorf("gateway info = %v", r.err)
		}
	})
	t.Run("unknown --gateway", func(t *testing.T) {
		r := tt.run("--gateway", "zzz", "status")
		if r.err == nil || !strings.Contains(r.err.Error(), `gateway "zzz" is not registered`) {
			t.Errorf("status = %v", r.err)
		}
	})
}
