package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/interceptor"
)

// testEnv returns a lookup function over vars, with HOME and the XDG
// directories pointed into a temp dir so no real user files are read.
func testEnv(t testing.TB, vars map[string]string) (LookupEnv, string) {
	t.Helper()
	home := t.TempDir()
	all := map[string]string{
		"HOME":            home,
		"XDG_CONFIG_HOME": filepath.Join(home, "config"),
		"XDG_STATE_HOME":  filepath.Join(home, "state"),
	}
	for k, v := range vars {
		all[k] = v
	}
	return func(k string) (string, bool) { v, ok := all[k]; return v, ok }, home
}

func writeFile(t testing.TB, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func load(t testing.TB, args []string, env map[string]string) (*Config, error) {
	t.Helper()
	lookup, _ := testEnv(t, env)
	return Load(args, lookup, io.Discard)
}

func TestDefaults(t *testing.T) {
	lookup, home := testEnv(t, nil)
	cfg, err := Load([]string{"--disable-tls"}, lookup, io.Discard)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	state := filepath.Join(home, "state")
	want := &Config{
		BindAddress:         "127.0.0.1",
		Port:                17670,
		LoopbackServiceHTTP: true,
		LogLevelName:        "info",
		DatabaseURL:         "sqlite:" + filepath.Join(state, "openshell", "gateway", "openshell.db"),
		StateDir:            filepath.Join(state, "openshell", "gateway"),
		DriverConfigs:       map[string]map[string]any{},
		CredentialsKEKFile:  filepath.Join(state, "openshell", "gateway", "credentials.kek"),
		TLS:                 TLS{LocalDir: filepath.Join(state, "openshell", "tls")},
		SSHSessionTTL:       24 * time.Hour,
		DatabaseWait:        60 * time.Second,
		SecurityEvents:      SecurityEvents{MaxSizeMB: 100, MaxFiles: 5},
	}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("Load() defaults mismatch (-want +got):\n%s", diff)
	}
	if got := cfg.Addr(); got != "127.0.0.1:17670" {
		t.Errorf("Addr() = %q, want 127.0.0.1:17670", got)
	}
}

func TestXDGDefaultConfigFile(t *testing.T) {
	lookup, home := testEnv(t, nil)
	writeFile(t, filepath.Join(home, "config", "openshell", "gateway.toml"), "[openshell]\nversion = 1\n[openshell.gateway]\nlog_level = \"debug\"\ndisable_tls = true\n")
	cfg, err := Load(nil, lookup, io.Discard)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if cfg.LogLevelName != "debug" || cfg.TLS.Enabled {
		t.Errorf("Load() = log %q tls %v, want debug and TLS off from the XDG file", cfg.LogLevelName, cfg.TLS.Enabled)
	}
	if !strings.HasSuffix(cfg.ConfigFile, "gateway.toml") {
		t.Errorf("ConfigFile = %q, want the XDG gateway.toml", cfg.ConfigFile)
	}
}

// TestPrecedence checks flag > env > file > default for every layer
// combination on a few representative settings.
func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "gw.toml"), `
[openshell]
version = 1
[openshell.gateway]
bind_address = "0.0.0.0:1001"
log_level = "warn"
disable_tls = true
ssh_session_ttl_secs = 60
database_wait_secs = 7
[openshell.gateway.oidc]
issuer = "https://file.example"
audience = "file-aud"
[openshell.gateway.auth]
allow_unauthenticated_users = true
`)
	type got struct {
		Port     int
		Bind     string
		Level    string
		Audience string
		Issuer   string
		SSH      time.Duration
		Unauth   bool
		DBWait   time.Duration
	}
	get := func(c *Config) got {
		return got{c.Port, c.BindAddress, c.LogLevelName, c.OIDC.Audience, c.OIDC.Issuer, c.SSHSessionTTL, c.Auth.AllowUnauthenticatedUsers, c.DatabaseWait}
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want got
	}{
		{
			name: "default",
			args: []string{"--disable-tls"},
			want: got{17670, "127.0.0.1", "info", "", "", 24 * time.Hour, false, time.Minute},
		},
		{
			name: "file beats default",
			args: []string{"--config", file},
			want: got{1001, "0.0.0.0", "warn", "file-aud", "https://file.example", time.Minute, true, 7 * time.Second},
		},
		{
			name: "env beats file",
			args: []string{"--config", file},
			env: map[string]string{
				"OPENSHELL_SERVER_PORT": "2002", "OPENSHELL_LOG_LEVEL": "error", "OPENSHELL_OIDC_AUDIENCE": "env-aud",
				"OPENSHELL_SSH_SESSION_TTL_SECS": "120", "OPENSHELL_ALLOW_UNAUTHENTICATED_USERS": "false", "OPENSHELL_BIND_ADDRESS": "::1",
				"OPENSHELL_DATABASE_WAIT_SECS": "8",
			},
			want: got{2002, "::1", "error", "env-aud", "https://file.example", 2 * time.Minute, false, 8 * time.Second},
		},
		{
			name: "flag beats env",
			args: []string{"--config", file, "--port", "3003", "--log-level", "debug", "--oidc-audience", "flag-aud", "--ssh-session-ttl-secs", "180", "--allow-unauthenticated-users", "--bind-address", "127.0.0.2", "--database-wait-secs", "0"},
			env: map[string]string{
				"OPENSHELL_SERVER_PORT": "2002", "OPENSHELL_LOG_LEVEL": "error", "OPENSHELL_OIDC_AUDIENCE": "env-aud",
				"OPENSHELL_SSH_SESSION_TTL_SECS": "120", "OPENSHELL_ALLOW_UNAUTHENTICATED_USERS": "false", "OPENSHELL_BIND_ADDRESS": "::1",
				"OPENSHELL_DATABASE_WAIT_SECS": "8",
			},
			want: got{3003, "127.0.0.2", "debug", "flag-aud", "https://file.example", 3 * time.Minute, true, 0},
		},
		{
			name: "config path from env",
			env:  map[string]string{"OPENSHELL_GATEWAY_CONFIG": file},
			want: got{1001, "0.0.0.0", "warn", "file-aud", "https://file.example", time.Minute, true, 7 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := load(t, tt.args, tt.env)
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if diff := cmp.Diff(tt.want, get(cfg)); diff != "" {
				t.Errorf("Load() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestListFlags(t *testing.T) {
	cfg, err := load(t, []string{"--disable-tls", "--driver", "docker,kubernetes", "--drivers", "process", "--driver", "docker"}, nil)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if diff := cmp.Diff([]string{"docker", "kubernetes", "process"}, cfg.Drivers); diff != "" {
		t.Errorf("Drivers (-want +got):\n%s", diff)
	}
	cfg, err = load(t, []string{"--disable-tls"}, map[string]string{"OPENSHELL_DRIVERS": "process, docker"})
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if diff := cmp.Diff([]string{"process", "docker"}, cfg.Drivers); diff != "" {
		t.Errorf("Drivers from env (-want +got):\n%s", diff)
	}
}

func TestFileErrors(t *testing.T) {
	tests := []struct {
		name  string
		toml  string
		wants []string
	}{
		//nolint:misspell // "adress" is the deliberate typo of the unknown key under test
		{
			name:  "unknown key",
			toml:  "[openshell]\nversion = 1\n[openshell.gateway]\nlog_level = \"info\"\nbind_adress = \"0.0.0.0:1\"\n",
			wants: []string{`unknown key "openshell.gateway.bind_adress"`, "line 5"},
		},
		{
			name:  "unknown key in sub-table",
			toml:  "[openshell.gateway.tls]\ncert_path = \"/x\"\n\nclient_ca = \"/y\"\n",
			wants: []string{`"openshell.gateway.tls.client_ca"`, "line 4"},
		},
		{
			name:  "unknown top-level table",
			toml:  "[gateway]\nport = 1\n",
			wants: []string{`unknown key "gateway`, "line 1"},
		},
		{
			name:  "wrong type",
			toml:  "[openshell.gateway]\n\nssh_session_ttl_secs = \"long\"\n",
			wants: []string{"line 3", "ssh_session_ttl_secs"},
		},
		{
			name:  "wrong type bool",
			toml:  "[openshell.gateway]\ndisable_tls = \"yes\"\n",
			wants: []string{"line 2", "disable_tls"},
		},
		{
			name:  "database_url in gateway",
			toml:  "[openshell.gateway]\ndatabase_url = \"postgres://u:p@h/db\"\n",
			wants: []string{"database_url is not allowed in the config file", "openshell.gateway.database_url", "OPENSHELL_DB_URL"},
		},
		{
			name:  "database_url in driver table",
			toml:  "[openshell.drivers.kubernetes]\ndatabase_url = \"x\"\n",
			wants: []string{"database_url is not allowed", "openshell.drivers.kubernetes.database_url"},
		},
		{
			name:  "bad version",
			toml:  "[openshell]\nversion = 2\n",
			wants: []string{"unsupported [openshell] version 2"},
		},
		{
			name:  "syntax error",
			toml:  "[openshell.gateway\n",
			wants: []string{"line 1"},
		},
		{
			name:  "bad bind_address",
			toml:  "[openshell.gateway]\nbind_address = \"0.0.0.0\"\n",
			wants: []string{"bind_address", "want ip:port"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), tt.toml)
			_, err := load(t, []string{"--config", path, "--disable-tls"}, nil)
			if err == nil {
				t.Fatalf("Load() = nil error, want one containing %q", tt.wants)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load() error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestMissingExplicitConfigFile(t *testing.T) {
	_, err := load(t, []string{"--config", filepath.Join(t.TempDir(), "nope.toml"), "--disable-tls"}, nil)
	if err == nil || !strings.Contains(err.Error(), "nope.toml") {
		t.Fatalf("Load() = %v, want error naming nope.toml", err)
	}
}

func TestValidation(t *testing.T) {
	dir := t.TempDir()
	cert := writeFile(t, filepath.Join(dir, "tls.crt"), "cert")
	key := writeFile(t, filepath.Join(dir, "tls.key"), "key")
	ca := writeFile(t, filepath.Join(dir, "ca.crt"), "ca")
	missing := filepath.Join(dir, "missing.crt")
	tlsArgs := []string{"--tls-cert", cert, "--tls-key", key}
	with := func(extra ...string) []string { return append(append([]string(nil), tlsArgs...), extra...) }
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"disable-tls with client ca", []string{"--disable-tls", "--tls-client-ca", ca}, nil, "--disable-tls and --tls-client-ca are mutually exclusive"},
		{"disable-tls with client ca from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_TLS_CLIENT_CA": ca}, "mutually exclusive"},
		{"tls without cert", []string{"--tls-key", key}, nil, "--tls-cert is required when TLS is enabled"},
		{"tls without key", []string{"--tls-cert", cert}, nil, "--tls-key is required when TLS is enabled"},
		{"unreadable cert", []string{"--tls-cert", missing, "--tls-key", key}, nil, "tls cert " + missing},
		{"unreadable client ca", with("--tls-client-ca", missing), nil, "tls client ca " + missing},
		{"unreadable jwt key", []string{"--disable-tls", "--jwt-signing-key", missing, "--jwt-public-key", cert, "--jwt-kid", key}, nil, "jwt signing key " + missing},
		{"incomplete jwt", []string{"--disable-tls", "--jwt-signing-key", cert}, nil, "gateway JWT needs signing key, public key and kid"},
		{"health equals port", []string{"--disable-tls", "--health-port", "17670"}, nil, "--port and --health-port must be different (both set to 17670)"},
		{"metrics equals port", []string{"--disable-tls", "--port", "9000", "--metrics-port", "9000"}, nil, "--port and --metrics-port must be different"},
		{"health equals metrics", []string{"--disable-tls", "--health-port", "9001", "--metrics-port", "9001"}, nil, "--health-port and --metrics-port must be different"},
		{"port out of range", []string{"--disable-tls", "--port", "70000"}, nil, `invalid value "70000" for flag -port: 70000 is out of range 1-65535`},
		{"port zero", []string{"--disable-tls", "--port", "0"}, nil, `invalid value "0" for flag -port: 0 is out of range 1-65535`},
		{"port zero from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_SERVER_PORT": "0"}, "--port: 0 is out of range 1-65535"},
		{"negative health port", []string{"--disable-tls", "--health-port", "-1"}, nil, `invalid value "-1" for flag -health-port: -1 is out of range 0-65535`},
		{"negative ssh ttl", []string{"--disable-tls", "--ssh-session-ttl-secs", "-5"}, nil, `invalid value "-5" for flag -ssh-session-ttl-secs: must not be negative`},
		{"negative ssh ttl from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_SSH_SESSION_TTL_SECS": "-5"}, "--ssh-session-ttl-secs: must not be negative"},
		{"relative security event sink", []string{"--disable-tls", "--security-event-sink", "events.jsonl"}, nil, `invalid value "events.jsonl" for flag -security-event-sink: "events.jsonl" is neither stdout nor an absolute file path`},
		{"relative security event sink from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_SECURITY_EVENT_SINK": "stderr"}, `--security-event-sink: "stderr" is neither stdout nor an absolute file path`},
		{"zero security event size", []string{"--disable-tls", "--security-event-max-size-mb", "0"}, nil, `invalid value "0" for flag -security-event-max-size-mb: 0 is out of range 1-1048576`},
		{"negative jwt ttl", []string{"--disable-tls", "--jwt-ttl-secs", "-1"}, nil, `invalid value "-1" for flag -jwt-ttl-secs: must not be negative`},
		{"negative rate limit", []string{"--disable-tls", "--grpc-rate-limit-requests", "-1"}, nil, `for flag -grpc-rate-limit-requests: must not be negative`},
		{"oidc issuer not a url", []string{"--disable-tls", "--oidc-issuer", "idp.example"}, nil, `invalid value "idp.example" for flag -oidc-issuer: "idp.example" is not an http(s) URL`},
		{"bad log level", []string{"--disable-tls", "--log-level", "loud"}, nil, `invalid value "loud" for flag -log-level: "loud" is not one of trace, debug, info, warn, error`},
		{"bad log level from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_LOG_LEVEL": "loud"}, `--log-level: "loud" is not one of`},
		{"bad int flag", []string{"--disable-tls", "--port", "abc"}, nil, "invalid integer"},
		{"bad int env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_SERVER_PORT": "x"}, "OPENSHELL_SERVER_PORT: invalid integer"},
		{"bad bool env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_DISABLE_TLS": "maybe"}, "OPENSHELL_DISABLE_TLS: invalid boolean"},
		{"bad bind address", []string{"--disable-tls", "--bind-address", "localhost"}, nil, "is not an IP address"},
		{"mtls without tls", []string{"--disable-tls", "--enable-mtls-auth"}, nil, "mTLS user authentication requires TLS"},
		{"mtls without client ca", with("--enable-mtls-auth"), nil, "mTLS user authentication requires --tls-client-ca"},
		{"mtls with kubernetes", with("--tls-client-ca", ca, "--enable-mtls-auth", "--drivers", "kubernetes"), nil, "not supported with the kubernetes compute driver"},
		{"rate limit half", []string{"--disable-tls", "--grpc-rate-limit-requests", "10"}, nil, "gRPC rate limiting requires both"},
		{"socket without drivers", []string{"--disable-tls", "--compute-driver-socket", "/run/x.sock"}, nil, "--compute-driver-socket requires --drivers"},
		{"socket with builtin", []string{"--disable-tls", "--compute-driver-socket", "/run/x.sock", "--drivers", "docker"}, nil, "reserved built-in compute driver"},
		{"bad db url", []string{"--disable-tls", "--db-url", "mysql://x"}, nil, `invalid value "mysql://x" for flag -db-url: unsupported scheme`},
		{"bad db url from env", []string{"--disable-tls"}, map[string]string{"OPENSHELL_DB_URL": "mysql://x"}, "--db-url: unsupported scheme"},
		{"unexpected arg", []string{"--disable-tls", "serve"}, nil, `unexpected argument "serve"`},
		{"unknown flag", []string{"--no-such-flag"}, nil, "no-such-flag"},
	}
	// A value a flag cannot take on its own, or a malformed command line,
	// is a usage error (exit 2); everything else, environment and file
	// values and combinations included, is an invalid configuration (exit 1).
	usage := map[string]bool{
		"port out of range": true, "port zero": true, "negative health port": true, "negative ssh ttl": true,
		"negative jwt ttl": true, "negative rate limit": true, "oidc issuer not a url": true, "bad log level": true,
		"bad int flag": true, "bad bind address": true, "bad db url": true, "unexpected arg": true, "unknown flag": true,
		"relative security event sink": true, "zero security event size": true,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load(%q) = %v, want error containing %q", tt.args, err, tt.want)
			}
			var ue *UsageError
			if got, want := errors.As(err, &ue), usage[tt.name]; got != want {
				t.Errorf("Load(%q) error %v: usage error = %v, want %v", tt.args, err, got, want)
			}
		})
	}
}

// TestNotImplementedRefused: a setting whose feature has not landed stops
// the gateway with a message naming where it was set, and is never a
// usage error (exit 1).
func TestNotImplementedRefused(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		toml string
		want string
	}{
		{name: "server san flag", args: []string{"--server-san", "gw.example"}, want: "--server-san: extra server names for the gateway"},
		{name: "jwks ttl key", toml: "[openshell.gateway.oidc]\njwks_ttl_secs = 60\n", want: "openshell.gateway.oidc.jwks_ttl_secs: a configurable OIDC key cache lifetime"},
		{name: "invalid interceptor", toml: "[[openshell.gateway.interceptors]]\nname = \"audit\"\n", want: "openshell.gateway.interceptors: interceptor \"audit\": grpc_endpoint \"\""},
		{name: "credential driver list", toml: "[openshell.gateway]\ncredential_drivers = [\"vault\"]\n", want: "openshell.gateway.credential_drivers: credential drivers"},
		{name: "default credential driver", toml: "[openshell.gateway]\ndefault_credential_driver = \"vault\"\n", want: "openshell.gateway.default_credential_driver: credential drivers"},
		{name: "credential storage", toml: "[openshell.gateway]\ncredential_storage = { key_encryption_key_env = \"K\" }\n", want: "openshell.gateway.credential_storage: credential drivers"},
		{name: "credential driver table", toml: "[openshell.credential_drivers.vault]\naddr = \"https://vault\"\n", want: "openshell.credential_drivers: credential drivers"},
		{name: "supervisor middleware", toml: "[[openshell.supervisor.middleware]]\nname = \"mw\"\n", want: "openshell.supervisor: supervisor middleware"},
		{name: "provider profile sources", toml: "[openshell.gateway]\nprovider_profile_sources = []\n", want: "openshell.gateway.provider_profile_sources: provider_profile_sources must contain at least one source"},
		{name: "unknown profile source", toml: "[openshell.gateway]\nprovider_profile_sources = [{ type = \"remote\" }]\n", want: "openshell.gateway.provider_profile_sources: [0]: unknown source type \"remote\""},
		{name: "policy failure mode", toml: "[openshell.gateway]\npolicy_validation_failure_mode = \"fail_closed\"\n", want: "openshell.gateway.policy_validation_failure_mode: policy validation failure modes"},
		{name: "external cert", toml: "[openshell.gateway.tls]\nexternal_cert_path = \"/c\"\nexternal_key_path = \"/k\"\n", want: "openshell.gateway.tls.external_cert_path: a second certificate chosen by SNI"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--disable-tls"}, tt.args...)
			if tt.toml != "" {
				args = append(args, "--config", writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), tt.toml))
			}
			_, err := load(t, args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load(%q) = %v, want error containing %q", args, err, tt.want)
			}
			if tt.toml != "" && !strings.Contains(err.Error(), "gw.toml") {
				t.Errorf("Load(%q) = %v, want the config file named", args, err)
			}
			var ue *UsageError
			if errors.As(err, &ue) {
				t.Errorf("Load(%q) = usage error %v, want an invalid configuration", args, err)
			}
		})
	}
}

// TestLoopbackServiceHTTP: plaintext service HTTP defaults to on for a
// loopback bind, can be turned off, and is refused on other addresses.
func TestLoopbackServiceHTTP(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    bool
		wantErr string
	}{
		{name: "loopback default", args: nil, want: true},
		{name: "loopback off", args: []string{"--enable-loopback-service-http=false"}, want: false},
		{name: "loopback env off", env: map[string]string{"OPENSHELL_ENABLE_LOOPBACK_SERVICE_HTTP": "false"}, want: false},
		{name: "any address default", args: []string{"--bind-address", "0.0.0.0"}, want: false},
		{name: "any address on", args: []string{"--bind-address", "0.0.0.0", "--enable-loopback-service-http"}, wantErr: "not a loopback address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := load(t, append([]string{"--disable-tls"}, tt.args...), tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load(%q) = %v, want error containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load(%q): %v", tt.args, err)
			}
			if cfg.LoopbackServiceHTTP != tt.want {
				t.Errorf("Load(%q).LoopbackServiceHTTP = %v, want %v", tt.args, cfg.LoopbackServiceHTTP, tt.want)
			}
		})
	}
}

func TestTLSAndAuthResolution(t *testing.T) {
	dir := t.TempDir()
	cert := writeFile(t, filepath.Join(dir, "tls.crt"), "cert")
	key := writeFile(t, filepath.Join(dir, "tls.key"), "key")
	ca := writeFile(t, filepath.Join(dir, "ca.crt"), "ca")
	base := []string{"--tls-cert", cert, "--tls-key", key}
	tests := []struct {
		name                string
		args                []string
		wantRequire, wantMT bool
	}{
		{"tls only", base, false, false},
		{"client ca, default drivers: mtls auto-on", append(base, "--tls-client-ca", ca), true, true},
		{"client ca, docker: mtls auto-on", append(base, "--tls-client-ca", ca, "--drivers", "docker"), true, true},
		{"client ca, kubernetes: no auto mtls", append(base, "--tls-client-ca", ca, "--drivers", "kubernetes"), true, false},
		{"client ca + oidc: optional client certs", append(base, "--tls-client-ca", ca, "--oidc-issuer", "https://idp.example"), false, false},
		{"explicit mtls off", append(base, "--tls-client-ca", ca, "--enable-mtls-auth=false"), true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := load(t, tt.args, nil)
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if cfg.TLS.RequireClientAuth != tt.wantRequire || cfg.Auth.MTLS != tt.wantMT {
				t.Errorf("Load() RequireClientAuth=%v MTLS=%v, want %v %v", cfg.TLS.RequireClientAuth, cfg.Auth.MTLS, tt.wantRequire, tt.wantMT)
			}
		})
	}
}

func TestAuxListeners(t *testing.T) {
	path := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), "[openshell.gateway]\ndisable_tls = true\nhealth_bind_address = \"127.0.0.1:9100\"\nmetrics_bind_address = \"127.0.0.1:9101\"\n")
	cfg, err := load(t, []string{"--config", path, "--bind-address", "0.0.0.0"}, nil)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if cfg.HealthAddress != "127.0.0.1:9100" || cfg.MetricsAddress != "127.0.0.1:9101" {
		t.Errorf("file listeners = %q %q, want 127.0.0.1:9100 127.0.0.1:9101", cfg.HealthAddress, cfg.MetricsAddress)
	}
	cfg, err = load(t, []string{"--config", path, "--bind-address", "0.0.0.0", "--health-port", "9200", "--metrics-port", "0"}, nil)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if cfg.HealthAddress != "0.0.0.0:9200" || cfg.MetricsAddress != "" {
		t.Errorf("flag listeners = %q %q, want 0.0.0.0:9200 and off", cfg.HealthAddress, cfg.MetricsAddress)
	}
}

func makeLocalDir(t testing.TB, files []string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		writeFile(t, filepath.Join(dir, filepath.FromSlash(f)), "x")
	}
	return dir
}

func TestLocalAutoDiscovery(t *testing.T) {
	all := append(append([]string(nil), LocalTLSFiles...), LocalJWTFiles...)
	t.Run("complete", func(t *testing.T) {
		dir := makeLocalDir(t, all)
		cfg, err := load(t, nil, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err != nil {
			t.Fatalf("Load() = %v", err)
		}
		wantTLS := TLS{
			Enabled: true, CertPath: filepath.Join(dir, "server/tls.crt"), KeyPath: filepath.Join(dir, "server/tls.key"),
			ClientCAPath: filepath.Join(dir, "ca.crt"), RequireClientAuth: true, AutoDiscovered: true, LocalDir: dir,
			ClientCertPath: filepath.Join(dir, "client/tls.crt"), ClientKeyPath: filepath.Join(dir, "client/tls.key"),
		}
		if diff := cmp.Diff(wantTLS, cfg.TLS); diff != "" {
			t.Errorf("TLS (-want +got):\n%s", diff)
		}
		wantJWT := JWT{
			SigningKeyPath: filepath.Join(dir, "jwt/signing.pem"), PublicKeyPath: filepath.Join(dir, "jwt/public.pem"),
			KIDPath: filepath.Join(dir, "jwt/kid"), GatewayID: "openshell", TTL: 0, AutoDiscovered: true,
		}
		if diff := cmp.Diff(wantJWT, cfg.JWT); diff != "" {
			t.Errorf("JWT (-want +got):\n%s", diff)
		}
		if !cfg.Auth.MTLS {
			t.Errorf("Auth.MTLS = false, want auto-on with discovered client CA")
		}
	})
	t.Run("explicit tls wins", func(t *testing.T) {
		dir := makeLocalDir(t, all)
		other := makeLocalDir(t, []string{"c", "k"})
		cfg, err := load(t, []string{"--tls-cert", filepath.Join(other, "c"), "--tls-key", filepath.Join(other, "k")}, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err != nil {
			t.Fatalf("Load() = %v", err)
		}
		if cfg.TLS.AutoDiscovered || cfg.TLS.ClientCAPath != "" || cfg.TLS.CertPath != filepath.Join(other, "c") {
			t.Errorf("TLS = %+v, want the explicit paths only", cfg.TLS)
		}
	})
	t.Run("disable-tls skips tls discovery", func(t *testing.T) {
		dir := makeLocalDir(t, all)
		cfg, err := load(t, []string{"--disable-tls"}, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err != nil {
			t.Fatalf("Load() = %v", err)
		}
		if cfg.TLS.Enabled || cfg.TLS.CertPath != "" || !cfg.JWT.Enabled() {
			t.Errorf("Load() TLS=%+v JWT enabled=%v, want TLS off and JWT discovered", cfg.TLS, cfg.JWT.Enabled())
		}
	})
	t.Run("partial tls", func(t *testing.T) {
		dir := makeLocalDir(t, []string{"ca.crt", "server/tls.crt"})
		_, err := load(t, nil, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err == nil || !strings.Contains(err.Error(), "partial local TLS state") || !strings.Contains(err.Error(), "missing server/tls.key, client/tls.crt, client/tls.key") {
			t.Fatalf("Load() = %v, want partial TLS error naming the missing files", err)
		}
	})
	t.Run("partial jwt", func(t *testing.T) {
		dir := makeLocalDir(t, []string{"jwt/kid"})
		_, err := load(t, []string{"--disable-tls"}, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err == nil || !strings.Contains(err.Error(), "missing jwt/signing.pem, jwt/public.pem") {
			t.Fatalf("Load() = %v, want partial JWT error", err)
		}
	})
	t.Run("explicit gateway id applies to discovered keys", func(t *testing.T) {
		dir := makeLocalDir(t, LocalJWTFiles)
		cfg, err := load(t, []string{"--disable-tls", "--gateway-id", "gw1", "--jwt-ttl-secs", "600"}, map[string]string{"OPENSHELL_LOCAL_TLS_DIR": dir})
		if err != nil {
			t.Fatalf("Load() = %v", err)
		}
		if cfg.JWT.GatewayID != "gw1" || cfg.JWT.TTL != 10*time.Minute || cfg.JWT.Issuer() != "openshell-gateway:gw1" {
			t.Errorf("JWT = %+v, want gateway id gw1 and ttl 10m", cfg.JWT)
		}
	})
}

func TestDriverInheritance(t *testing.T) {
	path := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), `
[openshell]
version = 1
[openshell.gateway]
disable_tls = true
compute_drivers = ["kubernetes", "docker", "process", "remote-x"]
sandbox_namespace = "agents"
default_image = "img:gw"
supervisor_image = "sup:gw"
host_gateway_ip = "10.0.0.1"
guest_tls_ca = "/ca"
service_account_name = "sa"
sa_token_ttl_secs = 600
enable_user_namespaces = true

[openshell.drivers.kubernetes]
default_image = "img:k8s"
image_pull_policy = "Always"

[openshell.drivers.docker]
socket_path = "/run/docker.sock"

[openshell.drivers.unused]
x = 1
`)
	cfg, err := load(t, []string{"--config", path}, nil)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	want := map[string]map[string]any{
		"kubernetes": {
			"default_image": "img:k8s", "image_pull_policy": "Always", "sandbox_namespace": "agents", "supervisor_image": "sup:gw",
			"service_account_name": "sa", "sa_token_ttl_secs": int64(600), "enable_user_namespaces": true,
		},
		"docker": {
			"socket_path": "/run/docker.sock", "default_image": "img:gw", "supervisor_image": "sup:gw", "host_gateway_ip": "10.0.0.1", "guest_tls_ca": "/ca",
		},
		"process":  {"default_image": "img:gw"},
		"remote-x": {},
		"unused":   {"x": int64(1)},
	}
	if diff := cmp.Diff(want, cfg.DriverConfigs); diff != "" {
		t.Errorf("DriverConfigs (-want +got):\n%s", diff)
	}
	if cfg.SandboxNamespace != "agents" {
		t.Errorf("SandboxNamespace = %q, want agents", cfg.SandboxNamespace)
	}
}

func TestHelpShowsWholeSurface(t *testing.T) {
	var out strings.Builder
	lookup, _ := testEnv(t, nil)
	_, err := Load([]string{"--help"}, lookup, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Load(--help) = %v, want flag.ErrHelp", err)
	}
	for _, sp := range specs {
		if !strings.Contains(out.String(), "--"+sp.name) {
			t.Errorf("--help lacks --%s", sp.name)
		}
		if sp.env != "" && !strings.Contains(out.String(), sp.env) {
			t.Errorf("--help lacks %s", sp.env)
		}
	}
	for _, s := range []string{"--driver ", "default 17670", "default 127.0.0.1", "default realm_access.roles"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help lacks %q", s)
		}
	}
}

func TestVersionSkipsValidation(t *testing.T) {
	cfg, err := load(t, []string{"--version"}, nil)
	if err != nil || !cfg.ShowVersion {
		t.Fatalf("Load(--version) = %+v, %v; want ShowVersion without error", cfg, err)
	}
}

// TestCredentialsKEK: the key-encryption key comes from the environment
// variable or a file (default in the state directory), never both.
func TestCredentialsKEK(t *testing.T) {
	cfg, err := load(t, []string{"--disable-tls", "--state-dir", "/s"}, nil)
	if err != nil || cfg.CredentialsKEKFile != "/s/credentials.kek" || cfg.CredentialsKEK != "" {
		t.Fatalf("default = %+v, %v", cfg, err)
	}
	cfg, err = load(t, []string{"--disable-tls", "--credentials-kek-file", "/k/kek"}, nil)
	if err != nil || cfg.CredentialsKEKFile != "/k/kek" {
		t.Fatalf("--credentials-kek-file: %v, %v", cfg, err)
	}
	cfg, err = load(t, []string{"--disable-tls"}, map[string]string{EnvCredentialsKEK: "a2V5"})
	if err != nil || cfg.CredentialsKEK != "a2V5" || cfg.CredentialsKEKFile != "" {
		t.Fatalf("%s: file %q, %v", EnvCredentialsKEK, cfg.CredentialsKEKFile, err)
	}
	cfg, err = load(t, []string{"--disable-tls", "--credentials-previous-kek-file", "/k/a,/k/b"}, map[string]string{EnvCredentialsPreviousKEK: "x, y"})
	if err != nil || !slices.Equal(cfg.CredentialsPreviousKEKFiles, []string{"/k/a", "/k/b"}) || !slices.Equal(cfg.CredentialsPreviousKEKs, []string{"x", "y"}) {
		t.Fatalf("previous keys: files %q, %d env keys, %v", cfg.CredentialsPreviousKEKFiles, len(cfg.CredentialsPreviousKEKs), err)
	}
	_, err = load(t, []string{"--disable-tls", "--credentials-kek-file", "/k/kek"}, map[string]string{EnvCredentialsKEK: "a2V5"})
	if err == nil || !strings.Contains(err.Error(), "are exclusive") {
		t.Fatalf("both = %v, want the exclusive error", err)
	}
}

// TestCredentialsKEKSecret: the Kubernetes Secret source takes no file
// (no default in the state directory), has a default data key, and is
// refused with any other source, naming both.
func TestCredentialsKEKSecret(t *testing.T) {
	cfg, err := load(t, []string{"--disable-tls", "--state-dir", "/s", "--credentials-kek-secret", "ns/kek"}, nil)
	if err != nil || cfg.CredentialsKEKSecret != "ns/kek" || cfg.CredentialsKEKSecretKey != "kek" || cfg.CredentialsKEKFile != "" || cfg.CredentialsKEK != "" {
		t.Fatalf("--credentials-kek-secret = %+v, %v", cfg, err)
	}
	cfg, err = load(t, []string{"--disable-tls"}, map[string]string{"OPENSHELL_CREDENTIALS_KEK_SECRET": "ns/kek", "OPENSHELL_CREDENTIALS_KEK_SECRET_KEY": "k2"})
	if err != nil || cfg.CredentialsKEKSecret != "ns/kek" || cfg.CredentialsKEKSecretKey != "k2" {
		t.Fatalf("env = %+v, %v", cfg, err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"secret and file", []string{"--credentials-kek-secret", "ns/kek", "--credentials-kek-file", "/k"}, nil, "--credentials-kek-secret and --credentials-kek-file are exclusive key-encryption key sources: set one"},
		{"secret and env", []string{"--credentials-kek-secret", "ns/kek"}, map[string]string{EnvCredentialsKEK: "a2V5"}, EnvCredentialsKEK + " and --credentials-kek-secret are exclusive key-encryption key sources: set one"},
		{"env and file", []string{"--credentials-kek-file", "/k"}, map[string]string{EnvCredentialsKEK: "a2V5"}, EnvCredentialsKEK + " and --credentials-kek-file are exclusive key-encryption key sources: set one"},
		{"all three", []string{"--credentials-kek-file", "/k"}, map[string]string{EnvCredentialsKEK: "a2V5", "OPENSHELL_CREDENTIALS_KEK_SECRET": "ns/kek"}, EnvCredentialsKEK + " and --credentials-kek-secret and --credentials-kek-file are exclusive"},
		{"key without secret", []string{"--credentials-kek-secret-key", "k"}, nil, "--credentials-kek-secret-key needs --credentials-kek-secret"},
		{"not namespace/name", []string{"--credentials-kek-secret", "kek"}, nil, `"kek" is not NAMESPACE/NAME`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, append([]string{"--disable-tls"}, tt.args...), tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load(%v, %v) = %v; want %q", tt.args, tt.env, err, tt.want)
			}
		})
	}
}

func TestSecurityEventSettings(t *testing.T) {
	file := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), `
[openshell]
version = 1
[openshell.gateway]
disable_tls = true
security_event_sink = "/var/log/os/events.jsonl"
security_event_max_size_mb = 7
security_event_max_files = 2
`)
	cfg, err := load(t, []string{"--config", file, "--security-event-max-files", "3"}, map[string]string{"OPENSHELL_SECURITY_EVENT_MAX_SIZE_MB": "9"})
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	want := SecurityEvents{Sink: "/var/log/os/events.jsonl", MaxSizeMB: 9, MaxFiles: 3}
	if diff := cmp.Diff(want, cfg.SecurityEvents); diff != "" {
		t.Errorf("SecurityEvents (-want +got):\n%s", diff)
	}
}

func TestOTLPTable(t *testing.T) {
	for _, tt := range []struct {
		name string
		toml string
		want *OTLP
	}{
		{"absent", "[openshell.gateway]\ndisable_tls = true\n", nil},
		{"empty table switches it on", "[openshell.gateway.otlp]\n", &OTLP{}},
		{"endpoint and service", "[openshell.gateway.otlp]\nendpoint = \"http://otel:4317\"\nservice_name = \"gw\"\n", &OTLP{Endpoint: "http://otel:4317", ServiceName: "gw"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), tt.toml)
			cfg, err := load(t, []string{"--disable-tls", "--config", file}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317"})
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if diff := cmp.Diff(tt.want, cfg.OTLP); diff != "" {
				t.Errorf("OTLP (-want +got):\n%s", diff)
			}
		})
	}
	file := writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), "[openshell.gateway.otlp]\nprotocol = \"http\"\n")
	if _, err := load(t, []string{"--disable-tls", "--config", file}, nil); err == nil || !strings.Contains(err.Error(), "protocol") {
		t.Errorf("Load(otlp.protocol) = %v, want the unknown key refused", err)
	}
}

func TestProviderProfileSources(t *testing.T) {
	toml := "[openshell.gateway]\nprovider_profile_sources = [{ type = \"user\" }, { type = \"interceptor\", name = \"catalog\" }]\n"
	cfg, err := load(t, []string{"--disable-tls", "--config", writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), toml)}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []interceptor.ProfileSourceConfig{{Type: "user"}, {Type: "interceptor", Name: "catalog"}}
	if !slices.Equal(cfg.ProviderProfileSources, want) {
		t.Errorf("ProviderProfileSources = %+v, want %+v", cfg.ProviderProfileSources, want)
	}
	cfg, err = load(t, []string{"--disable-tls"}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.ProviderProfileSources != nil {
		t.Errorf("ProviderProfileSources without the key = %+v, want nil (built-in, user)", cfg.ProviderProfileSources)
	}
}

func TestInterceptorTables(t *testing.T) {
	toml := "[[openshell.gateway.interceptors]]\nname = \"quota\"\ngrpc_endpoint = \"unix:///run/quota.sock\"\n" +
		"binding_policy = \"exact\"\ntimeout = \"250ms\"\n\n[[openshell.gateway.interceptors.bindings]]\n" +
		"rpc = \"openshell.v1.OpenShell/CreateSandbox\"\nphases = [\"modify_operation\", \"validate\"]\n"
	cfg, err := load(t, []string{"--disable-tls", "--config", writeFile(t, filepath.Join(t.TempDir(), "gw.toml"), toml)}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(cfg.Interceptors) != 1 || cfg.Interceptors[0].Name != "quota" || cfg.Interceptors[0].Timeout != 250*time.Millisecond ||
		len(cfg.Interceptors[0].Bindings) != 1 || len(cfg.Interceptors[0].Bindings[0].Phases) != 2 {
		t.Errorf("Interceptors = %+v", cfg.Interceptors)
	}
}

func TestOIDCLoginSettings(t *testing.T) {
	dir := t.TempDir()
	secret := writeFile(t, filepath.Join(dir, "login-secret"), "s3cret\n")
	open := writeFile(t, filepath.Join(dir, "open-secret"), "s3cret\n")
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	issuer := []string{"--disable-tls", "--oidc-issuer", "https://idp.example"}
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"client id without issuer", []string{"--disable-tls", "--oidc-login-client-id", "web"}, nil, "--oidc-login-client-id needs --oidc-issuer"},
		{"client id from env without issuer", []string{"--disable-tls"}, map[string]string{"OPENSHELL_OIDC_LOGIN_CLIENT_ID": "web"}, "--oidc-login-client-id needs --oidc-issuer"},
		{"secret without client id", append(issuer, "--oidc-login-client-secret-file", secret), nil, "--oidc-login-client-secret-file needs --oidc-login-client-id"},
		{"secret open to others", append(issuer, "--oidc-login-client-id", "web", "--oidc-login-client-secret-file", open), nil, "has mode 0644, want 0600"},
		{"secret missing", append(issuer, "--oidc-login-client-id", "web", "--oidc-login-client-secret-file", filepath.Join(dir, "nope")), nil, "cannot read"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load() = %v, want error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Load() error shows the secret: %v", err)
			}
		})
	}
	file := writeFile(t, filepath.Join(dir, "gateway.toml"), "[openshell.gateway.oidc]\nissuer = \"https://idp.example\"\nlogin_client_id = \"web\"\nlogin_client_secret_file = \""+secret+"\"\n")
	cfg, err := load(t, []string{"--disable-tls", "--config", file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OIDC.LoginClientID != "web" || cfg.OIDC.LoginClientSecretFile != secret {
		t.Errorf("OIDC = %+v, want login client web with its secret file", cfg.OIDC)
	}
}
