package config

import (
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/openshell-go/openshell/internal/interceptor"
)

// Defaults.
const (
	DefaultBindAddress    = "127.0.0.1"
	DefaultPort           = 17670
	DefaultLogLevel       = "info"
	DefaultOIDCAudience   = "openshell-cli"
	DefaultOIDCRolesClaim = "realm_access.roles"
	DefaultOIDCAdminRole  = "openshell-admin"
	DefaultOIDCUserRole   = "openshell-user"
	DefaultSSHSessionTTL  = 24 * time.Hour
	DefaultDatabaseWait   = 60 * time.Second
	DefaultLocalGatewayID = "openshell"
	// DefaultCredentialsKEKSecretKey is the data key of the key-encryption
	// key in a --credentials-kek-secret Secret.
	DefaultCredentialsKEKSecretKey = "kek"
	defaultGatewayFileName         = "gateway.toml"
)

// EnvCredentialsKEK carries the provider credentials' key-encryption key
// (base64 or hex of 32 bytes). It has no flag and no file key.
const EnvCredentialsKEK = "OPENSHELL_CREDENTIALS_KEK"

// EnvCredentialsPreviousKEK carries previous key-encryption keys, comma
// separated, during a rotation. It has no flag and no file key.
const EnvCredentialsPreviousKEK = "OPENSHELL_CREDENTIALS_PREVIOUS_KEK"

// Config is the resolved, validated gateway configuration. It is read-only
// after Load returns.
type Config struct {
	// ConfigFile is the TOML file that was read, or "".
	ConfigFile string
	// ShowVersion is set by --version; Load skips validation when it is set.
	ShowVersion bool

	// BindAddress and Port form the main listener (gRPC + HTTP on one port).
	BindAddress string
	Port        int
	// LoopbackServiceHTTP: the main port also accepts plaintext HTTP for
	// sandbox service hosts only. It defaults to on when BindAddress is a
	// loopback address and cannot be on otherwise.
	LoopbackServiceHTTP bool
	// HealthAddress and MetricsAddress are host:port of the optional
	// separate listeners, or "" when off.
	HealthAddress  string
	MetricsAddress string

	LogLevel slog.Level
	// LogLevelName is the configured level as written (trace/debug/info/warn/error).
	LogLevelName string

	// DatabaseURL is sqlite:<path> or postgres://... (flag/env only).
	DatabaseURL string
	// StateDir holds gateway state (default $XDG_STATE_HOME/openshell/gateway).
	StateDir string
	// CredentialsKEKFile is the key-encryption key file of provider
	// credentials (default <StateDir>/credentials.kek); empty when the key
	// comes from CredentialsKEK.
	CredentialsKEKFile string
	// CredentialsKEK is the key-encryption key itself (base64 or hex of 32
	// bytes), from the environment variable EnvCredentialsKEK only.
	CredentialsKEK string
	// CredentialsPreviousKEKFiles and CredentialsPreviousKEKs (from
	// EnvCredentialsPreviousKEK only, comma separated) are keys being
	// rotated out: values wrapped under them are re-wrapped at start.
	CredentialsPreviousKEKFiles []string
	CredentialsPreviousKEKs     []string
	// CredentialsKEKSecret is the Kubernetes Secret NAMESPACE/NAME holding
	// the key-encryption key under data key CredentialsKEKSecretKey (and
	// previous keys under previous-<key>...); when set, CredentialsKEKFile
	// and CredentialsKEK are empty.
	CredentialsKEKSecret    string
	CredentialsKEKSecretKey string

	// Drivers is the compute driver list (empty = auto-detect).
	Drivers []string
	// ComputeDriverSocket is the Unix socket of a remote compute driver.
	ComputeDriverSocket string
	// DriverConfigs holds the raw [openshell.drivers.<name>] tables with the
	// allowlisted gateway-wide keys already inherited. Every driver named in
	// Drivers has an entry (possibly empty).
	DriverConfigs map[string]map[string]any

	TLS  TLS
	Auth Auth
	OIDC OIDC
	JWT  JWT

	RateLimit RateLimit

	SecurityEvents SecurityEvents
	// OTLP is the [openshell.gateway.otlp] table; nil when absent (trace
	// export off, whatever OTEL_* variables say).
	OTLP *OTLP

	// Interceptors are the [[openshell.gateway.interceptors]] entries,
	// checked but not yet connected (internal/interceptor.Start does that).
	Interceptors []interceptor.Config
	// ProviderProfileSources is the ordered provider profile source set;
	// nil: built-in then user. Interceptor names are checked against the
	// started interceptors (interceptor.ProfileSources).
	ProviderProfileSources []interceptor.ProfileSourceConfig

	SSHSessionTTL    time.Duration
	DatabaseWait     time.Duration // start-up wait for an unreachable database (0 = fail at once)
	SandboxNamespace string
}

// Addr is the main listener address (host:port).
func (c *Config) Addr() string {
	return net.JoinHostPort(c.BindAddress, strconv.Itoa(c.Port))
}

// TLS describes the listener's TLS settings.
type TLS struct {
	// Enabled is false when TLS is disabled (plaintext listener).
	Enabled      bool
	CertPath     string
	KeyPath      string
	ClientCAPath string
	// RequireClientAuth is true when a client CA is set and OIDC is off:
	// every TLS client must then present a certificate signed by the CA.
	// Otherwise a presented certificate is verified but optional.
	RequireClientAuth bool
	// AutoDiscovered is true when the paths came from OPENSHELL_LOCAL_TLS_DIR.
	AutoDiscovered bool
	// LocalDir is the local PKI directory consulted (OPENSHELL_LOCAL_TLS_DIR).
	LocalDir string
	// ClientCertPath/ClientKeyPath are the discovered local client bundle,
	// useful for drivers that hand client certificates to sandboxes.
	ClientCertPath string
	ClientKeyPath  string
}

// Auth holds user authentication switches other than OIDC.
type Auth struct {
	// MTLS: client certificates signed by the client CA authenticate users.
	MTLS bool
	// AllowUnauthenticatedUsers: requests without credentials run as the
	// local-dev user.
	AllowUnauthenticatedUsers bool
}

// OIDC holds OIDC bearer settings; it is enabled when Issuer is non-empty.
type OIDC struct {
	Issuer      string
	Audience    string
	RolesClaim  string
	AdminRole   string
	UserRole    string
	ScopesClaim string
	// LoginClientID turns on the browser login of service URLs.
	LoginClientID string
	// LoginClientSecretFile holds the login client's secret (0600); empty
	// for a public client.
	LoginClientSecretFile string
}

// Enabled reports whether OIDC authentication is configured.
func (o OIDC) Enabled() bool { return o.Issuer != "" }

// JWT holds the gateway's sandbox JWT issuer settings.
type JWT struct {
	SigningKeyPath string
	PublicKeyPath  string
	KIDPath        string
	GatewayID      string
	// TTL of minted tokens; 0 means tokens never expire.
	TTL time.Duration
	// AutoDiscovered is true when the keys came from OPENSHELL_LOCAL_TLS_DIR.
	AutoDiscovered bool
}

// Enabled reports whether the JWT issuer is configured.
func (j JWT) Enabled() bool { return j.SigningKeyPath != "" }

// Issuer is the iss/aud claim value "openshell-gateway:<gateway_id>".
func (j JWT) Issuer() string { return "openshell-gateway:" + j.GatewayID }

// RateLimit limits gRPC requests; it is off when Requests or Window is zero.
type RateLimit struct {
	Requests int
	Window   time.Duration
}

// Enabled reports whether rate limiting is on.
func (r RateLimit) Enabled() bool { return r.Requests > 0 && r.Window > 0 }

// Defaults of SecurityEvents.
const (
	DefaultSecurityEventMaxSizeMB = 100
	DefaultSecurityEventMaxFiles  = 5
)

// SecurityEvents configures the security event sink (internal/securityevent).
type SecurityEvents struct {
	// Sink is "stdout", an absolute file path, or "" (events are only
	// counted in the metrics).
	Sink string
	// MaxSizeMB rotates the file before a line would take it past this size.
	MaxSizeMB int
	// MaxFiles is how many rotated files are kept.
	MaxFiles int
}

// OTLP is [openshell.gateway.otlp]: its presence turns OpenTelemetry trace
// export (OTLP over gRPC) on; the OTEL_* variables tune the exporter.
type OTLP struct {
	// Endpoint is http(s)://host:port; empty = the OTEL_* endpoint
	// variables, then localhost:4317.
	Endpoint string
	// ServiceName is service.name; empty = OTEL_SERVICE_NAME, then
	// openshell-gateway.
	ServiceName string
}
