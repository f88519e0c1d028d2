package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// fileRoot is the whole TOML document.
type fileRoot struct {
	OpenShell fileOpenShell `toml:"openshell"`
}

type fileOpenShell struct {
	Version           *int64                    `toml:"version"`
	Gateway           fileGateway               `toml:"gateway"`
	Drivers           map[string]map[string]any `toml:"drivers"`
	CredentialDrivers map[string]map[string]any `toml:"credential_drivers"`
	Supervisor        *fileSupervisor           `toml:"supervisor"`
}

type fileSupervisor struct {
	Middleware []map[string]any `toml:"middleware"`
}

// fileGateway is [openshell.gateway]. Pointers distinguish "absent" from the
// zero value so that only keys present in the file override defaults.
type fileGateway struct {
	BindAddress                 *string          `toml:"bind_address"`
	HealthBindAddress           *string          `toml:"health_bind_address"`
	MetricsBindAddress          *string          `toml:"metrics_bind_address"`
	LogLevel                    *string          `toml:"log_level"`
	ComputeDrivers              []string         `toml:"compute_drivers"`
	CredentialDrivers           []string         `toml:"credential_drivers"`
	DefaultCredentialDriver     *string          `toml:"default_credential_driver"`
	CredentialStorage           map[string]any   `toml:"credential_storage"`
	SandboxNamespace            *string          `toml:"sandbox_namespace"`
	SSHSessionTTLSecs           *int64           `toml:"ssh_session_ttl_secs"`
	SecurityEventSink           *string          `toml:"security_event_sink"`
	SecurityEventMaxSizeMB      *int64           `toml:"security_event_max_size_mb"`
	SecurityEventMaxFiles       *int64           `toml:"security_event_max_files"`
	DatabaseWaitSecs            *int64           `toml:"database_wait_secs"`
	GRPCRateLimitRequests       *int64           `toml:"grpc_rate_limit_requests"`
	GRPCRateLimitWindowSeconds  *int64           `toml:"grpc_rate_limit_window_seconds"`
	PolicyValidationFailureMode *string          `toml:"policy_validation_failure_mode"`
	ServerSANs                  []string         `toml:"server_sans"`
	EnableLoopbackServiceHTTP   *bool            `toml:"enable_loopback_service_http"`
	DefaultImage                *string          `toml:"default_image"`
	SupervisorImage             *string          `toml:"supervisor_image"`
	ClientTLSSecretName         *string          `toml:"client_tls_secret_name"`
	ServiceAccountName          *string          `toml:"service_account_name"`
	HostGatewayIP               *string          `toml:"host_gateway_ip"`
	EnableUserNamespaces        *bool            `toml:"enable_user_namespaces"`
	SATokenTTLSecs              *int64           `toml:"sa_token_ttl_secs"`
	GuestTLSCA                  *string          `toml:"guest_tls_ca"`
	GuestTLSCert                *string          `toml:"guest_tls_cert"`
	GuestTLSKey                 *string          `toml:"guest_tls_key"`
	DisableTLS                  *bool            `toml:"disable_tls"`
	ProviderProfileSources      []any            `toml:"provider_profile_sources"`
	Interceptors                []map[string]any `toml:"interceptors"`

	TLS        *fileTLS        `toml:"tls"`
	OIDC       *fileOIDC       `toml:"oidc"`
	Auth       *fileAuth       `toml:"auth"`
	MTLSAuth   *fileMTLSAuth   `toml:"mtls_auth"`
	GatewayJWT *fileGatewayJWT `toml:"gateway_jwt"`
	OTLP       *fileOTLP       `toml:"otlp"`
}

type fileTLS struct {
	CertPath            *string  `toml:"cert_path"`
	KeyPath             *string  `toml:"key_path"`
	ClientCAPath        *string  `toml:"client_ca_path"`
	RequireClientAuth   *bool    `toml:"require_client_auth"`
	ExternalCertPath    *string  `toml:"external_cert_path"`
	ExternalKeyPath     *string  `toml:"external_key_path"`
	ExternalServerNames []string `toml:"external_server_names"`
}

type fileOIDC struct {
	Issuer      *string `toml:"issuer"`
	Audience    *string `toml:"audience"`
	JWKSTTLSecs *int64  `toml:"jwks_ttl_secs"`
	RolesClaim  *string `toml:"roles_claim"`
	AdminRole   *string `toml:"admin_role"`
	UserRole    *string `toml:"user_role"`
	ScopesClaim *string `toml:"scopes_claim"`
	// LoginClientID and LoginClientSecretFile configure the browser login.
	LoginClientID         *string `toml:"login_client_id"`
	LoginClientSecretFile *string `toml:"login_client_secret_file"`
}

type fileAuth struct {
	AllowUnauthenticatedUsers *bool `toml:"allow_unauthenticated_users"`
}

type fileMTLSAuth struct {
	Enabled *bool `toml:"enabled"`
}

type fileGatewayJWT struct {
	SigningKeyPath *string `toml:"signing_key_path"`
	PublicKeyPath  *string `toml:"public_key_path"`
	KIDPath        *string `toml:"kid_path"`
	GatewayID      *string `toml:"gateway_id"`
	TTLSecs        *int64  `toml:"ttl_secs"`
}

type fileOTLP struct {
	Endpoint    *string `toml:"endpoint"`
	ServiceName *string `toml:"service_name"`
}

// SupportedFileVersion is the only accepted value of [openshell] version.
const SupportedFileVersion = 1

// readFile reads and strictly decodes the TOML file at path.
func readFile(path string) (*fileRoot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return decodeFile(path, data)
}

func decodeFile(path string, data []byte) (*fileRoot, error) {
	// First a loose pass: syntax errors and database_url anywhere.
	var loose map[string]any
	if err := toml.Unmarshal(data, &loose); err != nil {
		return nil, fileError(path, err)
	}
	if p := findKey(loose, "database_url", nil); p != "" {
		return nil, fmt.Errorf("config file %s: database_url is not allowed in the config file (found at %s); set it with --db-url or OPENSHELL_DB_URL", path, p)
	}

	var root fileRoot
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&root); err != nil {
		return nil, fileError(path, err)
	}
	if v := root.OpenShell.Version; v != nil && *v != SupportedFileVersion {
		return nil, fmt.Errorf("config file %s: unsupported [openshell] version %d; this gateway supports version %d", path, *v, SupportedFileVersion)
	}
	return &root, nil
}

// goTypeDetail matches the Go struct detail in go-toml type errors.
var goTypeDetail = regexp.MustCompile(`into struct field \S+ of type (\S+)`)

// fileError turns go-toml errors into messages naming key and line.
func fileError(path string, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		msgs := make([]string, 0, len(strict.Errors))
		for i := range strict.Errors {
			de := &strict.Errors[i]
			row, _ := de.Position()
			msgs = append(msgs, fmt.Sprintf("unknown key %q at line %d", strings.Join(de.Key(), "."), row))
		}
		return fmt.Errorf("config file %s: %s", path, strings.Join(msgs, "; "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		msg := goTypeDetail.ReplaceAllString(de.Error(), "into $1")
		if key := strings.Join(de.Key(), "."); key != "" {
			return fmt.Errorf("config file %s: line %d column %d: key %q: wrong value: %s", path, row, col, key, msg)
		}
		return fmt.Errorf("config file %s: line %d column %d: %s", path, row, col, msg)
	}
	return fmt.Errorf("config file %s: %w", path, err)
}

// findKey returns the dotted path of the first occurrence of key in a decoded
// TOML tree (in sorted order), or "".
func findKey(v any, key string, prefix []string) string {
	switch t := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(t))
		for k := range t {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			p := append(append([]string(nil), prefix...), k)
			if k == key {
				return strings.Join(p, ".")
			}
			if found := findKey(t[k], key, p); found != "" {
				return found
			}
		}
	case []any:
		for i, e := range t {
			p := append(append([]string(nil), prefix...), fmt.Sprintf("[%d]", i))
			if found := findKey(e, key, p); found != "" {
				return found
			}
		}
	case []map[string]any:
		for i, e := range t {
			p := append(append([]string(nil), prefix...), fmt.Sprintf("[%d]", i))
			if found := findKey(e, key, p); found != "" {
				return found
			}
		}
	}
	return ""
}
