package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// settings is the mutable working copy that layers are applied to, in order
// default < file < env < flag.
type settings struct {
	configPath          string
	secEventSink        string
	secEventMaxSizeMB   int
	secEventMaxFiles    int
	bindAddress         string
	port                int
	healthPort          int
	metricsPort         int
	healthBind          string // full host:port from the file
	metricsBind         string
	logLevel            string
	tlsCert             string
	tlsKey              string
	tlsClientCA         string
	dbURL               string
	drivers             []string
	computeDriverSocket string
	disableTLS          bool
	enableMTLSAuth      bool
	oidcIssuer          string
	oidcAudience        string
	oidcJWKSTTL         int
	oidcRolesClaim      string
	oidcAdminRole       string
	oidcUserRole        string
	oidcScopesClaim     string
	oidcLoginClientID   string
	oidcLoginSecretFile string
	rateRequests        int
	rateWindow          int
	serverSANs          []string
	loopbackHTTP        bool
	allowUnauth         bool
	stateDir            string
	kekFile             string
	prevKEKFiles        []string
	kekSecret           string
	kekSecretKey        string
	localTLSDir         string
	sshTTL              int
	dbWait              int
	jwtTTL              int
	jwtSigningKey       string
	jwtPublicKey        string
	jwtKID              string
	gatewayID           string
	version             bool

	// source records where each setting (by flag name) came from:
	// "file", "env" or "flag". Absent means default.
	source map[string]string
}

type kind int

const (
	kString kind = iota
	kInt
	kBool
	kList
)

// spec describes one setting: its flag, env variable, default and setter.
type spec struct {
	name  string
	alias string
	env   string
	kind  kind
	def   string // shown in --help
	usage string
	str   func(*settings) *string
	num   func(*settings) *int
	bool  func(*settings) *bool
	list  func(*settings) *[]string
	// check rejects a value the setting cannot take on its own (its
	// range or form); a flag with such a value is a usage error.
	check func(*settings) error
}

func (sp *spec) set(s *settings, v string) error {
	switch sp.kind {
	case kString:
		*sp.str(s) = v
	case kInt:
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("invalid integer %q", v)
		}
		*sp.num(s) = n
	case kBool:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("invalid boolean %q", v)
		}
		*sp.bool(s) = b
	case kList:
		*sp.list(s) = splitList(v)
	}
	return nil
}

func splitList(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// specs is the whole flag/env surface, in --help order.
var specs = []*spec{
	{name: "config", env: "OPENSHELL_GATEWAY_CONFIG", usage: "TOML config file (default $XDG_CONFIG_HOME/openshell/gateway.toml if present)", str: func(s *settings) *string { return &s.configPath }},
	{name: "bind-address", env: "OPENSHELL_BIND_ADDRESS", def: DefaultBindAddress, usage: "IP address the gateway listens on", str: func(s *settings) *string { return &s.bindAddress }, check: func(s *settings) error { return checkIP(s.bindAddress) }},
	{name: "port", env: "OPENSHELL_SERVER_PORT", kind: kInt, def: strconv.Itoa(DefaultPort), usage: "port for gRPC and HTTP (one port)", num: func(s *settings) *int { return &s.port }, check: func(s *settings) error { return checkRange(s.port, 1, 65535) }},
	{name: "health-port", env: "OPENSHELL_HEALTH_PORT", kind: kInt, def: "0", usage: "separate port for /healthz and /readyz (0 = off)", num: func(s *settings) *int { return &s.healthPort }, check: func(s *settings) error { return checkRange(s.healthPort, 0, 65535) }},
	{name: "metrics-port", env: "OPENSHELL_METRICS_PORT", kind: kInt, def: "0", usage: "separate port for /metrics (0 = off)", num: func(s *settings) *int { return &s.metricsPort }, check: func(s *settings) error { return checkRange(s.metricsPort, 0, 65535) }},
	{name: "log-level", env: "OPENSHELL_LOG_LEVEL", def: DefaultLogLevel, usage: "log level: trace, debug, info, warn, error", str: func(s *settings) *string { return &s.logLevel }, check: func(s *settings) error { return checkLogLevel(s.logLevel) }},
	{name: "tls-cert", env: "OPENSHELL_TLS_CERT", usage: "server certificate (PEM)", str: func(s *settings) *string { return &s.tlsCert }},
	{name: "tls-key", env: "OPENSHELL_TLS_KEY", usage: "server private key (PEM)", str: func(s *settings) *string { return &s.tlsKey }},
	{name: "tls-client-ca", env: "OPENSHELL_TLS_CLIENT_CA", usage: "CA that signs client certificates (enables client certificate verification)", str: func(s *settings) *string { return &s.tlsClientCA }},
	{name: "db-url", env: "OPENSHELL_DB_URL", def: "sqlite:$XDG_STATE_HOME/openshell/gateway/openshell.db", usage: "database URL: sqlite:<path> or postgres://... (never read from the config file)", str: func(s *settings) *string { return &s.dbURL }, check: func(s *settings) error { return checkDatabaseURL(s.dbURL) }},
	{name: "drivers", alias: "driver", env: "OPENSHELL_DRIVERS", kind: kList, usage: "compute drivers, comma separated (default auto-detect)", list: func(s *settings) *[]string { return &s.drivers }},
	{name: "compute-driver-socket", env: "OPENSHELL_COMPUTE_DRIVER_SOCKET", usage: "Unix socket of a remote compute driver (needs exactly one --drivers name)", str: func(s *settings) *string { return &s.computeDriverSocket }},
	{name: "disable-tls", env: "OPENSHELL_DISABLE_TLS", kind: kBool, def: "false", usage: "serve plaintext (local development)", bool: func(s *settings) *bool { return &s.disableTLS }},
	{name: "enable-mtls-auth", env: "OPENSHELL_ENABLE_MTLS_AUTH", kind: kBool, def: "false", usage: "authenticate users by client certificate (auto-on for local drivers with a client CA and no OIDC)", bool: func(s *settings) *bool { return &s.enableMTLSAuth }},
	{name: "oidc-issuer", env: "OPENSHELL_OIDC_ISSUER", usage: "OIDC issuer URL (enables OIDC bearer auth)", str: func(s *settings) *string { return &s.oidcIssuer }, check: func(s *settings) error { return checkHTTPURL(s.oidcIssuer) }},
	{name: "oidc-audience", env: "OPENSHELL_OIDC_AUDIENCE", def: DefaultOIDCAudience, usage: "expected OIDC audience", str: func(s *settings) *string { return &s.oidcAudience }},
	{name: "oidc-jwks-ttl", env: "OPENSHELL_OIDC_JWKS_TTL", kind: kInt, usage: "OIDC JWKS cache TTL in seconds (not implemented yet: setting it is refused)", num: func(s *settings) *int { return &s.oidcJWKSTTL }, check: func(s *settings) error { return checkNonNegative(s.oidcJWKSTTL) }},
	{name: "oidc-roles-claim", env: "OPENSHELL_OIDC_ROLES_CLAIM", def: DefaultOIDCRolesClaim, usage: "dotted path of the roles claim", str: func(s *settings) *string { return &s.oidcRolesClaim }},
	{name: "oidc-admin-role", env: "OPENSHELL_OIDC_ADMIN_ROLE", def: DefaultOIDCAdminRole, usage: "role granting admin RPCs", str: func(s *settings) *string { return &s.oidcAdminRole }},
	{name: "oidc-user-role", env: "OPENSHELL_OIDC_USER_ROLE", def: DefaultOIDCUserRole, usage: "role granting user RPCs", str: func(s *settings) *string { return &s.oidcUserRole }},
	{name: "oidc-scopes-claim", env: "OPENSHELL_OIDC_SCOPES_CLAIM", def: `""`, usage: "claim holding scopes (empty = scope checks off)", str: func(s *settings) *string { return &s.oidcScopesClaim }},
	{name: "oidc-login-client-id", env: "OPENSHELL_OIDC_LOGIN_CLIENT_ID", usage: "OAuth client id of the browser login to sandbox service URLs (enables it; needs --oidc-issuer)", str: func(s *settings) *string { return &s.oidcLoginClientID }},
	{name: "oidc-login-client-secret-file", env: "OPENSHELL_OIDC_LOGIN_CLIENT_SECRET_FILE", usage: "file (mode 0600) holding the client secret of the browser login; omit for a public client", str: func(s *settings) *string { return &s.oidcLoginSecretFile }},
	{name: "grpc-rate-limit-requests", env: "OPENSHELL_GRPC_RATE_LIMIT_REQUESTS", kind: kInt, def: "0", usage: "gRPC requests allowed per window (0 = off)", num: func(s *settings) *int { return &s.rateRequests }, check: func(s *settings) error { return checkNonNegative(s.rateRequests) }},
	{name: "grpc-rate-limit-window-seconds", env: "OPENSHELL_GRPC_RATE_LIMIT_WINDOW_SECONDS", kind: kInt, def: "0", usage: "gRPC rate limit window in seconds (0 = off)", num: func(s *settings) *int { return &s.rateWindow }, check: func(s *settings) error { return checkNonNegative(s.rateWindow) }},
	{name: "server-san", env: "OPENSHELL_SERVER_SAN", kind: kList, usage: "extra server name(s), comma separated or repeated (not implemented yet: setting it is refused; generate-certs takes --server-san)", list: func(s *settings) *[]string { return &s.serverSANs }},
	{name: "enable-loopback-service-http", env: "OPENSHELL_ENABLE_LOOPBACK_SERVICE_HTTP", kind: kBool, usage: "also accept plaintext HTTP on the main port for sandbox service hosts only (default on when bound to loopback; refused otherwise)", bool: func(s *settings) *bool { return &s.loopbackHTTP }},
	{name: "allow-unauthenticated-users", env: "OPENSHELL_ALLOW_UNAUTHENTICATED_USERS", kind: kBool, def: "false", usage: "requests without credentials run as the local-dev user (trusted local use only)", bool: func(s *settings) *bool { return &s.allowUnauth }},
	{name: "state-dir", env: "OPENSHELL_STATE_DIR", def: "$XDG_STATE_HOME/openshell/gateway", usage: "gateway state directory", str: func(s *settings) *string { return &s.stateDir }},
	{name: "credentials-kek-file", env: "OPENSHELL_CREDENTIALS_KEK_FILE", usage: "key-encryption key file for provider credentials (default <state-dir>/credentials.kek, created 0600 at first start); the key itself may instead come from OPENSHELL_CREDENTIALS_KEK", str: func(s *settings) *string { return &s.kekFile }},
	{name: "credentials-kek-secret", env: "OPENSHELL_CREDENTIALS_KEK_SECRET", usage: "Kubernetes Secret NAMESPACE/NAME holding the key-encryption key of provider credentials (created with 32 random bytes when absent and the gateway may create it); exclusive with --credentials-kek-file and OPENSHELL_CREDENTIALS_KEK", str: func(s *settings) *string { return &s.kekSecret }, check: func(s *settings) error { return checkSecretRef(s.kekSecret) }},
	{name: "credentials-kek-secret-key", env: "OPENSHELL_CREDENTIALS_KEK_SECRET_KEY", def: DefaultCredentialsKEKSecretKey, usage: "data key of the key-encryption key in --credentials-kek-secret; previous keys are under previous-<key> and previous-<key>-*", str: func(s *settings) *string { return &s.kekSecretKey }},
	{name: "credentials-previous-kek-file", env: "OPENSHELL_CREDENTIALS_PREVIOUS_KEK_FILE", kind: kList, usage: "previous key-encryption key file(s), comma separated or repeated: credentials wrapped under them are re-wrapped under the current key at start", list: func(s *settings) *[]string { return &s.prevKEKFiles }},
	{name: "local-tls-dir", env: "OPENSHELL_LOCAL_TLS_DIR", def: "$XDG_STATE_HOME/openshell/tls", usage: "generate-certs output consulted for TLS/JWT auto-discovery", str: func(s *settings) *string { return &s.localTLSDir }},
	{name: "database-wait-secs", env: "OPENSHELL_DATABASE_WAIT_SECS", kind: kInt, def: strconv.Itoa(int(DefaultDatabaseWait / time.Second)), usage: "how long start-up waits for an unreachable database, in seconds (0 = fail at once)", num: func(s *settings) *int { return &s.dbWait }, check: func(s *settings) error { return checkNonNegative(s.dbWait) }},
	{name: "ssh-session-ttl-secs", env: "OPENSHELL_SSH_SESSION_TTL_SECS", kind: kInt, def: strconv.Itoa(int(DefaultSSHSessionTTL / time.Second)), usage: "SSH session lifetime in seconds (0 = no limit)", num: func(s *settings) *int { return &s.sshTTL }, check: func(s *settings) error { return checkNonNegative(s.sshTTL) }},
	{name: "security-event-sink", env: "OPENSHELL_SECURITY_EVENT_SINK", usage: "security event JSON lines: stdout or an absolute file path (empty = events are only counted in /metrics)", str: func(s *settings) *string { return &s.secEventSink }, check: func(s *settings) error { return checkSecurityEventSink(s.secEventSink) }},
	{name: "security-event-max-size-mb", env: "OPENSHELL_SECURITY_EVENT_MAX_SIZE_MB", kind: kInt, def: strconv.Itoa(DefaultSecurityEventMaxSizeMB), usage: "rotate the security event file when it would pass this size in MiB", num: func(s *settings) *int { return &s.secEventMaxSizeMB }, check: func(s *settings) error { return checkRange(s.secEventMaxSizeMB, 1, 1<<20) }},
	{name: "security-event-max-files", env: "OPENSHELL_SECURITY_EVENT_MAX_FILES", kind: kInt, def: strconv.Itoa(DefaultSecurityEventMaxFiles), usage: "rotated security event files kept (<path>.1 … <path>.N)", num: func(s *settings) *int { return &s.secEventMaxFiles }, check: func(s *settings) error { return checkNonNegative(s.secEventMaxFiles) }},
	{name: "jwt-signing-key", env: "OPENSHELL_JWT_SIGNING_KEY", usage: "Ed25519 sandbox JWT signing key (PKCS#8 PEM)", str: func(s *settings) *string { return &s.jwtSigningKey }},
	{name: "jwt-public-key", env: "OPENSHELL_JWT_PUBLIC_KEY", usage: "Ed25519 sandbox JWT public key (PKIX PEM)", str: func(s *settings) *string { return &s.jwtPublicKey }},
	{name: "jwt-kid", env: "OPENSHELL_JWT_KID", usage: "file holding the sandbox JWT key id", str: func(s *settings) *string { return &s.jwtKID }},
	{name: "gateway-id", env: "OPENSHELL_GATEWAY_ID", def: DefaultLocalGatewayID, usage: "gateway id in JWT iss/aud (openshell-gateway:<id>)", str: func(s *settings) *string { return &s.gatewayID }},
	{name: "jwt-ttl-secs", env: "OPENSHELL_JWT_TTL_SECS", kind: kInt, def: "0", usage: "sandbox JWT lifetime in seconds (0 = never expires)", num: func(s *settings) *int { return &s.jwtTTL }, check: func(s *settings) error { return checkNonNegative(s.jwtTTL) }},
	{name: "version", kind: kBool, def: "false", usage: "print the version and exit", bool: func(s *settings) *bool { return &s.version }},
}

// recorder captures raw flag values; repeated list flags accumulate.
type recorder struct {
	sp   *spec
	vals *map[string][]string
}

func (r recorder) String() string { return "" }
func (r recorder) Set(v string) error {
	(*r.vals)[r.sp.name] = append((*r.vals)[r.sp.name], v)
	// Validate early so the error names the flag and the command line
	// is reported as wrong (exit 2).
	var scratch settings
	if err := r.sp.set(&scratch, v); err != nil {
		return err
	}
	if r.sp.check != nil {
		return r.sp.check(&scratch)
	}
	return nil
}
func (r recorder) IsBoolFlag() bool { return r.sp.kind == kBool }

// parseFlags parses args and returns raw values by flag name.
func parseFlags(args []string, output io.Writer) (map[string][]string, error) {
	vals := map[string][]string{}
	fs := flag.NewFlagSet("openshell-gateway", flag.ContinueOnError)
	fs.SetOutput(output)
	for _, sp := range specs {
		fs.Var(recorder{sp, &vals}, sp.name, sp.usage)
		if sp.alias != "" {
			fs.Var(recorder{sp, &vals}, sp.alias, "alias of --"+sp.name)
		}
	}
	fs.Usage = func() { Usage(output) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return nil, &UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return vals, nil
}

// UsageError is a malformed command line (as opposed to a configuration
// that parses but is invalid); commands exit with status 2 for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage writes the gateway's --help text: every flag with its environment
// variable and default.
func Usage(w io.Writer) {
	_, _ = fmt.Fprintf(w, "Usage: openshell-gateway [flags]\n       openshell-gateway generate-certs (--output-dir DIR | --namespace NS --server-secret-name S --client-secret-name S --jwt-secret-name S [--jwt-only]) [--server-san NAME]... [--dry-run]\n       openshell-gateway driver serve --driver NAME --socket PATH [--config FILE] [--state-dir DIR] [--gateway-endpoint URL]\n\n")
	_, _ = fmt.Fprintf(w, "Precedence: flag > OPENSHELL_* environment > TOML config file > default.\n\nFlags:\n")
	for _, sp := range specs {
		name := "--" + sp.name
		if sp.alias != "" {
			name += ", --" + sp.alias
		}
		switch sp.kind {
		case kInt:
			name += " N"
		case kString:
			name += " VALUE"
		case kList:
			name += " LIST"
		}
		_, _ = fmt.Fprintf(w, "  %s\n      %s", name, sp.usage)
		var extra []string
		if sp.env != "" {
			extra = append(extra, "env "+sp.env)
		}
		if sp.def != "" {
			extra = append(extra, "default "+sp.def)
		}
		if len(extra) > 0 {
			_, _ = fmt.Fprintf(w, " [%s]", strings.Join(extra, ", "))
		}
		_, _ = fmt.Fprintln(w)
	}
	_, _ = fmt.Fprintf(w, "\nSee docs/configuration.md for the TOML file schema.\n")
}
