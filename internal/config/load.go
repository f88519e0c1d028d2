package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/openshell-go/openshell/internal/interceptor"
)

// LookupEnv is the signature of os.LookupEnv.
type LookupEnv func(string) (string, bool)

// Load resolves the configuration from args (without the program name),
// the environment (use os.LookupEnv in production) and the TOML file, and
// validates it. --help writes Usage to output and returns flag.ErrHelp.
func Load(args []string, lookupEnv LookupEnv, output io.Writer) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	flags, err := parseFlags(args, output)
	if err != nil {
		return nil, err
	}

	s := defaults()

	// The config file path itself: flag > env > XDG default if present.
	path, explicit := "", false
	if v := flags["config"]; len(v) > 0 {
		path, explicit = v[len(v)-1], true
	} else if v, ok := lookupEnv("OPENSHELL_GATEWAY_CONFIG"); ok && v != "" {
		path, explicit = v, true
	} else if dir, err := xdgDir(lookupEnv, "XDG_CONFIG_HOME", ".config"); err == nil {
		candidate := filepath.Join(dir, "openshell", defaultGatewayFileName)
		if fi, err := os.Stat(candidate); err == nil && fi.Mode().IsRegular() {
			path = candidate
		}
	}
	var file *fileRoot
	if path != "" {
		file, err = readFile(path)
		if err != nil {
			if !explicit && errors.Is(err, os.ErrNotExist) {
				file = nil
			} else {
				return nil, err
			}
		}
		s.configPath = path
	}
	if file != nil {
		if err := s.applyFile(&file.OpenShell.Gateway); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
	}

	// Environment.
	for _, sp := range specs {
		if sp.env == "" {
			continue
		}
		v, ok := lookupEnv(sp.env)
		if !ok {
			continue
		}
		if err := sp.set(s, v); err != nil {
			return nil, fmt.Errorf("%s: %w", sp.env, err)
		}
		s.source[sp.name] = "env"
	}
	// Flags.
	for _, sp := range specs {
		vals, ok := flags[sp.name]
		if !ok {
			continue
		}
		v := vals[len(vals)-1]
		if sp.kind == kList {
			v = strings.Join(vals, ",")
		}
		if err := sp.set(s, v); err != nil {
			return nil, fmt.Errorf("--%s: %w", sp.name, err)
		}
		s.source[sp.name] = "flag"
	}

	cfg := &Config{ConfigFile: path}
	if file == nil {
		cfg.ConfigFile = ""
	}
	if s.version {
		cfg.ShowVersion = true
		return cfg, nil
	}
	if err := s.resolve(cfg, file, lookupEnv); err != nil {
		return nil, err
	}
	return cfg, nil
}

func defaults() *settings {
	return &settings{
		bindAddress:       DefaultBindAddress,
		port:              DefaultPort,
		logLevel:          DefaultLogLevel,
		oidcAudience:      DefaultOIDCAudience,
		oidcRolesClaim:    DefaultOIDCRolesClaim,
		oidcAdminRole:     DefaultOIDCAdminRole,
		oidcUserRole:      DefaultOIDCUserRole,
		sshTTL:            int(DefaultSSHSessionTTL / time.Second),
		secEventMaxSizeMB: DefaultSecurityEventMaxSizeMB,
		secEventMaxFiles:  DefaultSecurityEventMaxFiles,
		dbWait:            int(DefaultDatabaseWait / time.Second),
		gatewayID:         DefaultLocalGatewayID,
		source:            map[string]string{},
	}
}

// applyFile copies [openshell.gateway] values over the defaults.
func (s *settings) applyFile(g *fileGateway) error {
	setS := func(name string, dst *string, v *string) {
		if v != nil {
			*dst = *v
			s.source[name] = "file"
		}
	}
	setI := func(name string, dst *int, v *int64) {
		if v != nil {
			*dst = int(*v)
			s.source[name] = "file"
		}
	}
	setB := func(name string, dst *bool, v *bool) {
		if v != nil {
			*dst = *v
			s.source[name] = "file"
		}
	}
	if g.BindAddress != nil {
		host, port, err := splitHostPort(*g.BindAddress)
		if err != nil {
			return fmt.Errorf("bind_address: %w", err)
		}
		s.bindAddress, s.port = host, port
		s.source["bind-address"], s.source["port"] = "file", "file"
	}
	if g.HealthBindAddress != nil {
		if _, _, err := splitHostPort(*g.HealthBindAddress); err != nil {
			return fmt.Errorf("health_bind_address: %w", err)
		}
		s.healthBind = *g.HealthBindAddress
	}
	if g.MetricsBindAddress != nil {
		if _, _, err := splitHostPort(*g.MetricsBindAddress); err != nil {
			return fmt.Errorf("metrics_bind_address: %w", err)
		}
		s.metricsBind = *g.MetricsBindAddress
	}
	setS("log-level", &s.logLevel, g.LogLevel)
	if g.ComputeDrivers != nil {
		s.drivers = slices.Clone(g.ComputeDrivers)
		s.source["drivers"] = "file"
	}
	setI("ssh-session-ttl-secs", &s.sshTTL, g.SSHSessionTTLSecs)
	setS("security-event-sink", &s.secEventSink, g.SecurityEventSink)
	setI("security-event-max-size-mb", &s.secEventMaxSizeMB, g.SecurityEventMaxSizeMB)
	setI("security-event-max-files", &s.secEventMaxFiles, g.SecurityEventMaxFiles)
	setI("database-wait-secs", &s.dbWait, g.DatabaseWaitSecs)
	setI("grpc-rate-limit-requests", &s.rateRequests, g.GRPCRateLimitRequests)
	setI("grpc-rate-limit-window-seconds", &s.rateWindow, g.GRPCRateLimitWindowSeconds)
	if g.ServerSANs != nil {
		s.serverSANs = slices.Clone(g.ServerSANs)
		s.source["server-san"] = "file"
	}
	setB("enable-loopback-service-http", &s.loopbackHTTP, g.EnableLoopbackServiceHTTP)
	setB("disable-tls", &s.disableTLS, g.DisableTLS)
	if t := g.TLS; t != nil {
		setS("tls-cert", &s.tlsCert, t.CertPath)
		setS("tls-key", &s.tlsKey, t.KeyPath)
		setS("tls-client-ca", &s.tlsClientCA, t.ClientCAPath)
	}
	if o := g.OIDC; o != nil {
		setS("oidc-issuer", &s.oidcIssuer, o.Issuer)
		setS("oidc-audience", &s.oidcAudience, o.Audience)
		setI("oidc-jwks-ttl", &s.oidcJWKSTTL, o.JWKSTTLSecs)
		setS("oidc-roles-claim", &s.oidcRolesClaim, o.RolesClaim)
		setS("oidc-admin-role", &s.oidcAdminRole, o.AdminRole)
		setS("oidc-user-role", &s.oidcUserRole, o.UserRole)
		setS("oidc-scopes-claim", &s.oidcScopesClaim, o.ScopesClaim)
		setS("oidc-login-client-id", &s.oidcLoginClientID, o.LoginClientID)
		setS("oidc-login-client-secret-file", &s.oidcLoginSecretFile, o.LoginClientSecretFile)
	}
	if a := g.Auth; a != nil {
		setB("allow-unauthenticated-users", &s.allowUnauth, a.AllowUnauthenticatedUsers)
	}
	if m := g.MTLSAuth; m != nil {
		setB("enable-mtls-auth", &s.enableMTLSAuth, m.Enabled)
		s.source["enable-mtls-auth"] = "file"
	}
	if j := g.GatewayJWT; j != nil {
		setS("jwt-signing-key", &s.jwtSigningKey, j.SigningKeyPath)
		setS("jwt-public-key", &s.jwtPublicKey, j.PublicKeyPath)
		setS("jwt-kid", &s.jwtKID, j.KIDPath)
		setS("gateway-id", &s.gatewayID, j.GatewayID)
		setI("jwt-ttl-secs", &s.jwtTTL, j.TTLSecs)
	}
	return nil
}

func splitHostPort(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("want ip:port, got %q", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("invalid port in %q", addr)
	}
	return host, port, nil
}

// xdgDir returns $<env> or $HOME/<fallback>.
func xdgDir(lookupEnv LookupEnv, env, fallback string) (string, error) {
	if v, ok := lookupEnv(env); ok && v != "" && filepath.IsAbs(v) {
		return v, nil
	}
	home, ok := lookupEnv("HOME")
	if !ok || home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("cannot determine home directory for $%s: %w", env, err)
		}
		home = h
	}
	return filepath.Join(home, fallback), nil
}

var logLevels = map[string]slog.Level{
	"trace":   slog.LevelDebug - 4,
	"debug":   slog.LevelDebug,
	"info":    slog.LevelInfo,
	"warn":    slog.LevelWarn,
	"warning": slog.LevelWarn,
	"error":   slog.LevelError,
}

// singlePlayerDrivers run sandboxes for the local user; with them mTLS user
// auth turns on by itself when a client CA is configured and OIDC is off.
var singlePlayerDrivers = map[string]bool{"process": true, "docker": true, "podman": true, "vm": true}

// reservedDrivers are built-in names a --compute-driver-socket may not use.
var reservedDrivers = map[string]bool{"process": true, "docker": true, "podman": true, "kubernetes": true, "vm": true}

// resolve derives, auto-discovers and validates, filling cfg.
func (s *settings) resolve(cfg *Config, file *fileRoot, lookupEnv LookupEnv) error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	stateHome, stateErr := xdgDir(lookupEnv, "XDG_STATE_HOME", filepath.Join(".local", "state"))
	needState := func() bool {
		if stateErr != nil {
			fail("%v", stateErr)
			return false
		}
		return true
	}

	// Listener.
	cfg.BindAddress = s.bindAddress
	if err := checkIP(s.bindAddress); err != nil {
		fail("--bind-address: %v", err)
	}
	cfg.Port = s.port
	if err := checkRange(s.port, 1, 65535); err != nil {
		fail("--port: %v", err)
	}
	loopback := net.ParseIP(s.bindAddress).IsLoopback()
	cfg.LoopbackServiceHTTP = loopback
	if s.source["enable-loopback-service-http"] != "" {
		if s.loopbackHTTP && !loopback {
			fail("--enable-loopback-service-http: the gateway is bound to %s, not a loopback address; plaintext service HTTP is only served on loopback", s.bindAddress)
		}
		cfg.LoopbackServiceHTTP = s.loopbackHTTP && loopback
	}
	aux := func(name string, port int, fileAddr string) string {
		if err := checkRange(port, 0, 65535); err != nil {
			fail("--%s: %v", name, err)
			return ""
		}
		if src := s.source[name]; src == "env" || src == "flag" {
			if port == 0 {
				return ""
			}
			return net.JoinHostPort(s.bindAddress, strconv.Itoa(port))
		}
		if fileAddr != "" {
			return fileAddr
		}
		if port == 0 {
			return ""
		}
		return net.JoinHostPort(s.bindAddress, strconv.Itoa(port))
	}
	cfg.HealthAddress = aux("health-port", s.healthPort, s.healthBind)
	cfg.MetricsAddress = aux("metrics-port", s.metricsPort, s.metricsBind)
	portOf := func(addr string) int {
		if addr == "" {
			return 0
		}
		_, p, _ := splitHostPort(addr)
		return p
	}
	hp, mp := portOf(cfg.HealthAddress), portOf(cfg.MetricsAddress)
	if hp != 0 && hp == cfg.Port {
		fail("--port and --health-port must be different (both set to %d)", cfg.Port)
	}
	if mp != 0 && mp == cfg.Port {
		fail("--port and --metrics-port must be different (both set to %d)", cfg.Port)
	}
	if hp != 0 && hp == mp {
		fail("--health-port and --metrics-port must be different (both set to %d)", hp)
	}

	// Logging.
	cfg.LogLevelName = strings.ToLower(strings.TrimSpace(s.logLevel))
	if err := checkLogLevel(s.logLevel); err != nil {
		fail("--log-level: %v", err)
	} else {
		cfg.LogLevel = logLevels[cfg.LogLevelName]
	}

	// State and database.
	cfg.StateDir = s.stateDir
	if cfg.StateDir == "" && needState() {
		cfg.StateDir = filepath.Join(stateHome, "openshell", "gateway")
	}
	// The provider credentials' key-encryption key: the environment
	// variable (never a flag: a key on the command line is visible to every
	// local user) or a file, by default in the state directory.
	// Exactly one source: the variable, a Secret or a file.
	cfg.CredentialsKEKFile = s.kekFile
	cfg.CredentialsKEKSecret = s.kekSecret
	envKEK, _ := lookupEnv(EnvCredentialsKEK)
	var kekSources []string
	if envKEK != "" {
		kekSources = append(kekSources, EnvCredentialsKEK)
	}
	if s.kekSecret != "" {
		kekSources = append(kekSources, "--credentials-kek-secret")
	}
	if s.kekFile != "" {
		kekSources = append(kekSources, "--credentials-kek-file")
	}
	if len(kekSources) > 1 {
		fail("%s are exclusive key-encryption key sources: set one", strings.Join(kekSources, " and "))
	}
	if s.source["credentials-kek-secret-key"] != "" && s.kekSecret == "" {
		fail("--credentials-kek-secret-key needs --credentials-kek-secret")
	}
	switch {
	case envKEK != "":
		cfg.CredentialsKEK = envKEK
	case s.kekSecret != "":
		cfg.CredentialsKEKSecretKey = s.kekSecretKey
		if cfg.CredentialsKEKSecretKey == "" {
			cfg.CredentialsKEKSecretKey = DefaultCredentialsKEKSecretKey
		}
	case cfg.CredentialsKEKFile == "" && cfg.StateDir != "":
		cfg.CredentialsKEKFile = filepath.Join(cfg.StateDir, "credentials.kek")
	}
	cfg.CredentialsPreviousKEKFiles = s.prevKEKFiles
	if v, ok := lookupEnv(EnvCredentialsPreviousKEK); ok && v != "" {
		cfg.CredentialsPreviousKEKs = splitList(v)
	}
	cfg.DatabaseURL = s.dbURL
	if cfg.DatabaseURL == "" && needState() {
		cfg.DatabaseURL = "sqlite:" + filepath.Join(stateHome, "openshell", "gateway", "openshell.db")
	}
	if err := checkDatabaseURL(cfg.DatabaseURL); err != nil {
		fail("--db-url: %v", err)
	}
	localDir := s.localTLSDir
	if localDir == "" && needState() {
		localDir = filepath.Join(stateHome, "openshell", "tls")
	}

	// Drivers.
	for _, d := range s.drivers {
		d = strings.ToLower(strings.TrimSpace(d))
		if d == "" {
			continue
		}
		if !slices.Contains(cfg.Drivers, d) {
			cfg.Drivers = append(cfg.Drivers, d)
		}
	}
	cfg.ComputeDriverSocket = s.computeDriverSocket
	if s.computeDriverSocket != "" {
		switch {
		case s.source["drivers"] == "":
			fail("--compute-driver-socket requires --drivers <name> or OPENSHELL_DRIVERS=<name> to select a non-reserved compute driver name")
		case len(cfg.Drivers) != 1:
			fail("--compute-driver-socket requires exactly one compute driver name, got: %s", strings.Join(cfg.Drivers, ","))
		case reservedDrivers[cfg.Drivers[0]]:
			fail("--compute-driver-socket cannot be combined with reserved built-in compute driver %q", cfg.Drivers[0])
		}
	}
	var g fileGateway
	if file != nil {
		g = file.OpenShell.Gateway
	}
	cfg.DriverConfigs = driverConfigs(file, cfg.Drivers)

	// TLS, with local auto-discovery.
	cfg.TLS.LocalDir = localDir
	tlsExplicit := s.tlsCert != "" || s.tlsKey != "" || s.tlsClientCA != ""
	if !s.disableTLS && localDir != "" {
		found, err := discover(localDir, LocalTLSFiles, "local TLS")
		if err != nil {
			if !tlsExplicit {
				errs = append(errs, err)
			}
		} else if found {
			cfg.TLS.ClientCertPath = filepath.Join(localDir, "client", "tls.crt")
			cfg.TLS.ClientKeyPath = filepath.Join(localDir, "client", "tls.key")
			if !tlsExplicit {
				s.tlsCert = filepath.Join(localDir, "server", "tls.crt")
				s.tlsKey = filepath.Join(localDir, "server", "tls.key")
				s.tlsClientCA = filepath.Join(localDir, "ca.crt")
				cfg.TLS.AutoDiscovered = true
			}
		}
	}
	if s.disableTLS && s.tlsClientCA != "" {
		fail("--disable-tls and --tls-client-ca are mutually exclusive; client certificate verification requires TLS")
	}
	cfg.TLS.Enabled = !s.disableTLS
	if cfg.TLS.Enabled {
		if s.tlsCert == "" {
			fail("--tls-cert is required when TLS is enabled (use --disable-tls to skip)")
		}
		if s.tlsKey == "" {
			fail("--tls-key is required when TLS is enabled (use --disable-tls to skip)")
		}
		cfg.TLS.CertPath, cfg.TLS.KeyPath, cfg.TLS.ClientCAPath = s.tlsCert, s.tlsKey, s.tlsClientCA
		for _, f := range []struct{ what, path string }{
			{"tls cert", cfg.TLS.CertPath}, {"tls key", cfg.TLS.KeyPath}, {"tls client ca", cfg.TLS.ClientCAPath},
		} {
			if err := readable(f.what, f.path); err != nil {
				errs = append(errs, err)
			}
		}
	}

	// OIDC.
	if s.oidcIssuer != "" {
		cfg.OIDC = OIDC{
			Issuer:                s.oidcIssuer,
			Audience:              s.oidcAudience,
			RolesClaim:            s.oidcRolesClaim,
			AdminRole:             s.oidcAdminRole,
			UserRole:              s.oidcUserRole,
			ScopesClaim:           s.oidcScopesClaim,
			LoginClientID:         s.oidcLoginClientID,
			LoginClientSecretFile: s.oidcLoginSecretFile,
		}
		if err := checkHTTPURL(s.oidcIssuer); err != nil {
			fail("--oidc-issuer: %v", err)
		}
	}
	switch {
	case s.oidcLoginClientID != "" && s.oidcIssuer == "":
		fail("--oidc-login-client-id needs --oidc-issuer")
	case s.oidcLoginSecretFile != "" && s.oidcLoginClientID == "":
		fail("--oidc-login-client-secret-file needs --oidc-login-client-id")
	case s.oidcLoginSecretFile != "":
		if err := secretFile("oidc login client secret file", s.oidcLoginSecretFile); err != nil {
			errs = append(errs, err)
		}
	}
	cfg.TLS.RequireClientAuth = cfg.TLS.Enabled && cfg.TLS.ClientCAPath != "" && !cfg.OIDC.Enabled()

	// Auth.
	cfg.Auth.AllowUnauthenticatedUsers = s.allowUnauth
	if s.source["enable-mtls-auth"] != "" {
		cfg.Auth.MTLS = s.enableMTLSAuth
	} else {
		cfg.Auth.MTLS = cfg.TLS.Enabled && cfg.TLS.ClientCAPath != "" && !cfg.OIDC.Enabled() && singlePlayer(cfg.Drivers, lookupEnv)
	}
	if cfg.Auth.MTLS {
		if !cfg.TLS.Enabled {
			fail("mTLS user authentication requires TLS; remove --disable-tls or disable --enable-mtls-auth")
		} else if cfg.TLS.ClientCAPath == "" {
			fail("mTLS user authentication requires --tls-client-ca so client certificates can be verified")
		}
		if slices.Contains(cfg.Drivers, "kubernetes") {
			fail("mTLS user authentication is not supported with the kubernetes compute driver; configure OIDC or a trusted fronting proxy for user authentication")
		}
	}

	// Sandbox JWT issuer.
	jwtExplicit := s.jwtSigningKey != "" || s.jwtPublicKey != "" || s.jwtKID != ""
	if jwtExplicit {
		if s.jwtSigningKey == "" || s.jwtPublicKey == "" || s.jwtKID == "" {
			fail("gateway JWT needs signing key, public key and kid paths together (--jwt-signing-key, --jwt-public-key, --jwt-kid)")
		}
		cfg.JWT = JWT{SigningKeyPath: s.jwtSigningKey, PublicKeyPath: s.jwtPublicKey, KIDPath: s.jwtKID, GatewayID: s.gatewayID, TTL: time.Duration(s.jwtTTL) * time.Second}
	} else if localDir != "" {
		found, err := discover(localDir, LocalJWTFiles, "local sandbox JWT")
		if err != nil {
			errs = append(errs, err)
		} else if found {
			cfg.JWT = JWT{
				SigningKeyPath: filepath.Join(localDir, "jwt", "signing.pem"),
				PublicKeyPath:  filepath.Join(localDir, "jwt", "public.pem"),
				KIDPath:        filepath.Join(localDir, "jwt", "kid"),
				GatewayID:      DefaultLocalGatewayID,
				AutoDiscovered: true,
			}
			// Explicit gateway id / ttl still apply to discovered keys.
			if s.source["gateway-id"] != "" {
				cfg.JWT.GatewayID = s.gatewayID
			}
			if s.source["jwt-ttl-secs"] != "" {
				cfg.JWT.TTL = time.Duration(s.jwtTTL) * time.Second
			}
		}
	}
	if cfg.JWT.Enabled() {
		if err := checkNonNegative(s.jwtTTL); err != nil {
			fail("--jwt-ttl-secs: %v", err)
		}
		if strings.TrimSpace(cfg.JWT.GatewayID) == "" {
			fail("--gateway-id: must not be empty")
		}
		for _, f := range []struct{ what, path string }{
			{"jwt signing key", cfg.JWT.SigningKeyPath}, {"jwt public key", cfg.JWT.PublicKeyPath}, {"jwt kid", cfg.JWT.KIDPath},
		} {
			if err := readable(f.what, f.path); err != nil {
				errs = append(errs, err)
			}
		}
	}

	// Rate limit.
	switch {
	case s.rateRequests < 0 || s.rateWindow < 0:
		fail("gRPC rate limit values must not be negative")
	case s.rateRequests == 0 || s.rateWindow == 0:
		if (s.rateRequests > 0 && s.source["grpc-rate-limit-window-seconds"] == "") ||
			(s.rateWindow > 0 && s.source["grpc-rate-limit-requests"] == "") {
			fail("gRPC rate limiting requires both --grpc-rate-limit-requests and --grpc-rate-limit-window-seconds (TOML keys grpc_rate_limit_requests and grpc_rate_limit_window_seconds) to be positive; set either value to 0 to disable")
		}
	default:
		cfg.RateLimit = RateLimit{Requests: s.rateRequests, Window: time.Duration(s.rateWindow) * time.Second}
	}

	// The rest.
	if err := checkNonNegative(s.sshTTL); err != nil {
		fail("--ssh-session-ttl-secs: %v", err)
	}
	cfg.SSHSessionTTL = time.Duration(s.sshTTL) * time.Second
	if err := checkSecurityEventSink(s.secEventSink); err != nil {
		fail("--security-event-sink: %v", err)
	}
	if err := checkRange(s.secEventMaxSizeMB, 1, 1<<20); err != nil {
		fail("--security-event-max-size-mb: %v", err)
	}
	if err := checkNonNegative(s.secEventMaxFiles); err != nil {
		fail("--security-event-max-files: %v", err)
	}
	cfg.SecurityEvents = SecurityEvents{Sink: s.secEventSink, MaxSizeMB: s.secEventMaxSizeMB, MaxFiles: s.secEventMaxFiles}
	if err := checkNonNegative(s.dbWait); err != nil {
		fail("--database-wait-secs: %v", err)
	}
	cfg.DatabaseWait = time.Duration(s.dbWait) * time.Second
	cfg.SandboxNamespace = deref(g.SandboxNamespace)
	if o := g.OTLP; o != nil {
		cfg.OTLP = &OTLP{Endpoint: deref(o.Endpoint), ServiceName: deref(o.ServiceName)}
	}
	if file != nil && g.Interceptors != nil {
		ics, err := interceptor.ParseConfigs(g.Interceptors)
		if err != nil {
			fail("config file %s: openshell.gateway.interceptors: %v", cfg.ConfigFile, err)
		}
		cfg.Interceptors = ics
	}
	if file != nil && g.ProviderProfileSources != nil {
		ps, err := interceptor.ParseProfileSources(g.ProviderProfileSources)
		if err != nil {
			fail("config file %s: openshell.gateway.provider_profile_sources: %v", cfg.ConfigFile, err)
		}
		cfg.ProviderProfileSources = ps
	}
	errs = append(errs, s.refuseNotImplemented(file, cfg.ConfigFile)...)
	return errors.Join(errs...)
}

func singlePlayer(drivers []string, lookupEnv LookupEnv) bool {
	switch len(drivers) {
	case 0:
		// Auto-detect: in a cluster the kubernetes driver is chosen.
		_, inCluster := lookupEnv("KUBERNETES_SERVICE_HOST")
		return !inCluster
	case 1:
		return singlePlayerDrivers[drivers[0]]
	}
	return false
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// secretFile checks that a file holding a secret is readable and open to
// its owner only.
func secretFile(what, path string) error {
	if err := readable(what, path); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, errors.Unwrap(err))
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s %s has mode %04o, want 0600", what, path, fi.Mode().Perm())
	}
	return nil
}

// readable checks that path (if set) can be opened for reading.
func readable(what, path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s %s: cannot read: %w", what, path, errors.Unwrap(err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return fmt.Errorf("%s %s: is a directory", what, path)
	}
	return nil
}

// LocalTLSFiles are the TLS files of a generate-certs directory.
var LocalTLSFiles = []string{"ca.crt", "server/tls.crt", "server/tls.key", "client/tls.crt", "client/tls.key"}

// LocalJWTFiles are the sandbox JWT files of a generate-certs directory.
var LocalJWTFiles = []string{"jwt/signing.pem", "jwt/public.pem", "jwt/kid"}

// discover reports whether all files exist under dir; none → false; some →
// an error naming the missing ones.
func discover(dir string, files []string, what string) (bool, error) {
	var missing []string
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err != nil || !fi.Mode().IsRegular() {
			missing = append(missing, f)
		}
	}
	switch len(missing) {
	case 0:
		return true, nil
	case len(files):
		return false, nil
	}
	return false, fmt.Errorf("partial %s state in %s: missing %s (expected %s); rerun openshell-gateway generate-certs after removing the directory, or pass the paths explicitly",
		what, dir, strings.Join(missing, ", "), strings.Join(files, ", "))
}
