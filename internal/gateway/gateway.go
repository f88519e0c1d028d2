// Package gateway is the openshell-gateway program: it parses the
// configuration, opens the store, selects the compute driver, wires the
// lifecycle engine, relays and API services into the server, and owns the
// process lifecycle (signals, drain, shutdown in reverse start order).
//
// A gateway holds an exclusive lock on its state directory while it runs
// (see lockStateDir), and a start-up that fails removes what it created
// (see startupRecord).
package gateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/prometheus/client_golang/prometheus"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	"github.com/openshell-go/openshell/internal/api"
	apiauthz "github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/api/identity"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/auth/mtls"
	"github.com/openshell-go/openshell/internal/auth/oidc"
	"github.com/openshell-go/openshell/internal/auth/sandboxjwt"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetrace"
	"github.com/openshell-go/openshell/internal/compute/remote"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/credentials"
	credk8s "github.com/openshell-go/openshell/internal/credentials/k8s"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/interceptor"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/pki"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/server"
	"github.com/openshell-go/openshell/internal/store"
	storeopen "github.com/openshell-go/openshell/internal/store/open"
	"github.com/openshell-go/openshell/internal/store/storetrace"
	"github.com/openshell-go/openshell/internal/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Run runs openshell-gateway with args (without the program name).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "generate-certs":
			return RunGenerateCerts(ctx, args[1:], stdout, stderr)
		case "driver":
			return runDriver(ctx, args[1:], stdout, stderr)
		}
	}
	cfg, err := config.Load(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	if cfg.ShowVersion {
		_, _ = fmt.Fprintf(stdout, "openshell-gateway %s\n", version.Version)
		return nil
	}
	logger := newLogger(stderr, cfg.LogLevel)
	return Serve(ctx, cfg, logger)
}

// ExitCode maps an error returned by Run to a process exit code.
func ExitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue *usageError
	var cue *config.UsageError
	if errors.As(err, &ue) || errors.As(err, &cue) {
		return 2
	}
	return 1
}

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// Serve runs the gateway for cfg until ctx ends. It is what Run calls after
// parsing; tests call it with a config built in code.
//
// Only one gateway runs on a state directory: a second one fails with a
// message naming the first one's pid. A start-up that fails removes what
// it created (see startupRecord) and nothing else.
func Serve(ctx context.Context, cfg *config.Config, logger *slog.Logger) (err error) {
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	created := recordStartup(cfg.StateDir, cfg.DatabaseURL)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		created.undo(logger)
		return fmt.Errorf("state dir %s: %w", cfg.StateDir, err)
	}
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		if !errors.Is(err, errdefs.ErrFailedPrecondition) { // not another gateway's directory
			created.undo(logger)
		}
		return err
	}
	serving := false
	cleanups = append(cleanups, func() { _ = lock.Close() }) // releases the lock, last
	cleanups = append(cleanups, func() {                     // runs after everything else closed
		if err != nil && !serving {
			created.undo(logger)
		}
	})

	// Listener first: a taken port fails fast, before anything is touched.
	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr(), err)
	}
	cleanups = append(cleanups, func() { ln.Close() })
	tracing := setupTracing(ctx, cfg, logger)
	cleanups = append(cleanups, func() { flushTracing(tracing, logger) }) // after the server loop, engine and drivers

	st, err := openStoreWaiting(ctx, logger, cfg.DatabaseWait, func(ctx context.Context) (store.Store, error) {
		return storeopen.Open(ctx, cfg.DatabaseURL, logger)
	})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	cleanups = append(cleanups, func() { _ = st.Close() }) // best effort on the way out
	if tracing.Enabled {
		st = storetrace.New(st)
	}
	if err := ensureDefaultWorkspace(ctx, st); err != nil {
		return err
	}

	// Sandbox identity.
	var issuer *sandboxjwt.Issuer
	var verifier *sandboxjwt.Verifier
	if cfg.JWT.Enabled() {
		priv, pub, kid, err := pki.LoadJWTKeys(cfg.JWT.SigningKeyPath, cfg.JWT.PublicKeyPath, cfg.JWT.KIDPath)
		if err != nil {
			return fmt.Errorf("gateway jwt keys: %w", err)
		}
		if issuer, err = sandboxjwt.NewIssuer(priv, kid, cfg.JWT.GatewayID, cfg.JWT.TTL); err != nil {
			return err
		}
		if verifier, err = sandboxjwt.NewVerifier(cfg.JWT.GatewayID, sandboxjwt.Key{KID: kid, Public: pub}); err != nil {
			return err
		}
	} else {
		logger.Warn("sandbox JWT issuer not configured: sandboxes cannot authenticate to this gateway; run `openshell-gateway generate-certs` or set [openshell.gateway.gateway_jwt]")
	}

	// Callback socket for local drivers' sandboxes: sandbox RPCs only.
	runDir := filepath.Join(cfg.StateDir, "run")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return err
	}
	cbPath := filepath.Join(runDir, "gateway.sock")
	_ = os.Remove(cbPath)
	cbLn, err := net.Listen("unix", cbPath)
	if err != nil {
		return fmt.Errorf("callback socket %s: %w", cbPath, err)
	}
	if err := os.Chmod(cbPath, 0o600); err != nil {
		return err
	}
	cleanups = append(cleanups, func() { cbLn.Close(); _ = os.Remove(cbPath) }) // best effort on the way out

	driverName, driver, err := selectDriver(ctx, cfg, logger, "unix://"+cbPath)
	if err != nil {
		return err
	}
	if _, isRemote := driver.(*remote.Driver); tracing.Enabled && !isRemote {
		// In-process drivers: a span per call (remote calls have their client spans).
		driver = computetrace.New(driver, driverName)
	}
	if c, ok := driver.(io.Closer); ok {
		cleanups = append(cleanups, func() { c.Close() })
	}
	caps, err := driver.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("compute driver %s: %w", driverName, err)
	}
	logger.Info("compute driver selected", "driver", driverName, "version", caps.DriverVersion)

	var minter lifecycle.TokenIssuer
	if issuer != nil {
		minter = issuer
	}
	keyring, nPrev, err := loadKEK(ctx, cfg, logger)
	if err != nil {
		return err
	}
	provs := providers.NewStore(providers.Options{Objects: st, Keyring: keyring})
	if err := rewrapCredentials(ctx, nPrev, logger, provs); err != nil {
		return err
	}
	engine, err := lifecycle.New(ctx, lifecycle.Options{
		Store: lifecycle.ObjectStore{S: st}, Driver: driver, DriverName: driverName, Issuer: minter, Logger: logger,
		ProviderExists: provs.Exists,
		// A create checks its workspace again once its row is in, so that
		// it cannot land in a workspace being deleted.
		WorkspaceAccepts: apiauthz.New(apiauthz.Options{Store: st}).WorkspaceAcceptsSandboxes,
	})
	if err != nil {
		return err
	}
	relays := relay.New(relay.Config{
		SandboxExists: engine.SandboxExists,
		OnSessionChange: func(id string, connected bool, instance string) {
			engine.SessionChanged(context.WithoutCancel(ctx), id, connected, instance)
		},
		Logger: logger,
	})
	cleanups = append(cleanups, relays.Close)

	host, port := gatewayHostPort(cfg)
	scheme := "http"
	if cfg.TLS.Enabled {
		scheme = "https"
	}
	var apiMinter identity.TokenMinter
	if issuer != nil {
		apiMinter = issuer
	}
	sandboxLogs := sandboxlog.New(0)
	registry := prometheus.NewRegistry()
	secEvents, closeSecEvents, err := openSecurityEvents(cfg.SecurityEvents, sandboxLogs, registry)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, closeSecEvents)
	svcURLs, err := serviceURLs(cfg)
	if err != nil {
		return err
	}
	if err := checkServiceLogin(cfg, svcURLs); err != nil {
		return err
	}
	sandboxes := api.New(api.Options{
		ServiceURLs: svcURLs,
		Engine:      engine, Relay: relays, Logs: sandboxLogs, Store: st, Minter: apiMinter, Providers: provs,
		SSHSessionTTL: cfg.SSHSessionTTL, GatewayHost: host, GatewayPort: port, GatewayScheme: scheme, Logger: logger,
		OIDC: cfg.OIDC.Enabled(), AdminRole: cfg.OIDC.AdminRole, SecurityEvents: secEvents,
	})

	// Drivers whose sandboxes bootstrap from a platform identity (the
	// kubernetes driver: projected ServiceAccount tokens) supply the
	// authenticator for IssueSandboxToken. Minting needs the JWT issuer.
	var bootstrap auth.Authenticator
	if b, ok := driver.(compute.BootstrapAuthenticatorProvider); ok {
		if issuer == nil {
			logger.Warn("sandbox bootstrap authentication is off: no JWT issuer is configured", "driver", driverName)
		} else if bootstrap, err = b.BootstrapAuthenticator(ctx); err != nil {
			return fmt.Errorf("compute driver %s: bootstrap authenticator: %w", driverName, err)
		}
	}
	chain, authz, login, err := buildAuth(cfg, verifier, bootstrap, keyring)
	if err != nil {
		return err
	}
	srvOpts := server.Options{
		Logger: logger, Authenticator: chain, Authorizer: authz, CallbackListener: cbLn,
		Registry: registry, SecurityEvents: secEvents, TracerProvider: tracing.TracerFor(),
		Services: sandboxes.ServiceRouter, LoopbackServiceHTTP: cfg.LoopbackServiceHTTP && cfg.TLS.Enabled,
		ServiceLogin: login,
		RateLimit:    server.RateLimit{Requests: cfg.RateLimit.Requests, Window: cfg.RateLimit.Window},
		Deps: server.Deps{
			Logger: logger, API: sandboxes, Inference: sandboxes.Inference,
			Drivers: func(context.Context) ([]server.DriverInfo, error) {
				return []server.DriverInfo{{Name: driverName, Capabilities: caps}}, nil
			},
		},
	}
	var icpt *interceptor.Runtime
	if len(cfg.Interceptors) > 0 {
		io := interceptor.Options{Configs: cfg.Interceptors, Logger: logger, Metrics: registry}
		if issuer != nil { // no JWT key: interceptors get no extension token
			io.Tokens = issuer
		}
		rt, err := interceptor.Start(ctx, io)
		if err != nil {
			return fmt.Errorf("gateway interceptors: %w", err)
		}
		cleanups = append(cleanups, rt.Close)
		srvOpts.RequestInterceptor = rt.UnaryServerInterceptor()
		icpt = rt
	}
	if cfg.ProviderProfileSources != nil {
		ps, err := interceptor.ProfileSources(cfg.ProviderProfileSources, icpt, logger)
		if err != nil {
			return fmt.Errorf("provider profile sources: %w", err)
		}
		provs.SetProfileSources(ps)
	}
	if issuer != nil {
		srvOpts.Deps.SandboxTokens = issuer
	}
	if verifier != nil {
		srvOpts.JWKS = verifier.JWKS
		srvOpts.Discovery = verifier.Discovery
	}
	if cfg.TLS.Enabled {
		tc, err := pki.ServerTLSConfig(cfg.TLS.CertPath, cfg.TLS.KeyPath, cfg.TLS.ClientCAPath, cfg.TLS.RequireClientAuth)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		srvOpts.TLSConfig = tc
	}
	for _, aux := range []struct {
		addr string
		dst  *net.Listener
	}{{cfg.HealthAddress, &srvOpts.HealthListener}, {cfg.MetricsAddress, &srvOpts.MetricsListener}} {
		if aux.addr == "" {
			continue
		}
		l, err := net.Listen("tcp", aux.addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", aux.addr, err)
		}
		*aux.dst = l
		cleanups = append(cleanups, func() { l.Close() })
	}
	var ready sync.Once
	readyCh := make(chan struct{})
	rd := &readiness{started: readyCh, store: st, driver: driver, driverName: driverName, log: logger, now: time.Now}
	srvOpts.Ready = rd.check
	srvOpts.Deps.Status = rd.status
	srv, err := server.New(srvOpts)
	if err != nil {
		return err
	}

	// Reconcile store and backends, then start watching. The server only
	// reports ready after that.
	engineCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	engineDone := make(chan error, 1)
	if err := engine.Recover(ctx); err != nil {
		logger.Warn("recover sandboxes", "err", err)
	}
	go func() { engineDone <- engine.Run(engineCtx) }()
	// Refreshed provider credentials are minted again before they expire.
	refreshCtx, stopRefresh := context.WithCancel(context.WithoutCancel(ctx))
	refreshDone := make(chan struct{})
	go func() {
		defer close(refreshDone)
		provs.RunRefresher(refreshCtx, logger.With("component", "providers/refresh"), providerRefreshInterval)
	}()
	ready.Do(func() { close(readyCh) })

	logger.Info("openshell-gateway serving", "addr", ln.Addr().String(), "tls", cfg.TLS.Enabled, "driver", driverName,
		"database", redactURL(cfg.DatabaseURL), "callback", cbPath, "version", version.Version)
	// Supervisor sessions are endless streams: end them as soon as the
	// drain starts so the graceful stop does not wait for its deadline.
	sessionsClosed := make(chan struct{})
	go func() {
		defer close(sessionsClosed)
		<-ctx.Done()
		sandboxes.Close()
		relays.Close()
	}()
	serving = true
	serveErr := srv.Serve(ctx, ln)
	<-sessionsClosed

	// Shutdown in reverse start order: API drained (Serve returned),
	// then the credential refresher, the engine, and the sandboxes the
	// gateway manages.
	stopRefresh()
	<-refreshDone
	stopEngine()
	<-engineDone //nolint:errcheck // joined only: Run returns nil once its context ends
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine.StopManaged(stopCtx)
	if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
		return serveErr
	}
	return nil
}

// providerRefreshInterval is how often the gateway looks for provider
// credentials due for a refresh.
const providerRefreshInterval = 30 * time.Second

func gatewayHostPort(cfg *config.Config) (string, uint32) {
	host := cfg.BindAddress
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return host, uint32(cfg.Port)
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// buildAuth returns the authenticator chain, the per-RPC authorizer and,
// when configured, the OIDC browser login of service URLs (else nil),
// whose sealing key is derived from keyring's KEK.
func buildAuth(cfg *config.Config, verifier *sandboxjwt.Verifier, bootstrap auth.Authenticator, keyring *credentials.Keyring) (*auth.Chain, *auth.Authorizer, server.ServiceLogin, error) {
	var login server.ServiceLogin
	opts := auth.ChainOptions{AllowUnauthenticated: cfg.Auth.AllowUnauthenticatedUsers, K8sServiceAccount: bootstrap}
	if verifier != nil {
		opts.SandboxJWT = verifier
	}
	if cfg.OIDC.Enabled() {
		a, err := oidc.New(oidc.Options{Issuer: cfg.OIDC.Issuer, Audience: cfg.OIDC.Audience, RolesClaim: cfg.OIDC.RolesClaim, ScopesClaim: cfg.OIDC.ScopesClaim})
		if err != nil {
			return nil, nil, nil, err
		}
		opts.OIDC = a
		if cfg.OIDC.LoginClientID != "" {
			if login, err = serviceLogin(cfg.OIDC, a, keyring); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	if cfg.Auth.MTLS {
		opts.MTLS = mtls.Authenticator{}
	}
	authz, err := auth.NewAuthorizer(auth.AuthorizerOptions{
		OIDC: cfg.OIDC.Enabled(), AdminRole: cfg.OIDC.AdminRole, UserRole: cfg.OIDC.UserRole, Scopes: cfg.OIDC.ScopesClaim != "",
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return auth.NewChain(opts), authz, login, nil
}

// serviceLogin builds the browser login of service URLs on a's issuer.
// Its login states and sessions are sealed with a key derived from the
// credentials KEK, so every replica holding the KEK, and the gateway after
// a restart, accepts them; a KEK rotation ends them.
func serviceLogin(o config.OIDC, a *oidc.Authenticator, keyring *credentials.Keyring) (server.ServiceLogin, error) {
	key, err := keyring.DeriveKey("oidc service login")
	if err != nil {
		return nil, err
	}
	lo := oidc.LoginOptions{ClientID: o.LoginClientID, Key: key}
	if o.LoginClientSecretFile != "" {
		b, err := os.ReadFile(o.LoginClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("oidc login client secret file %s: %w", o.LoginClientSecretFile, errors.Unwrap(err))
		}
		lo.ClientSecret = strings.TrimSpace(string(b))
		if lo.ClientSecret == "" {
			return nil, fmt.Errorf("oidc login client secret file %s is empty", o.LoginClientSecretFile)
		}
	}
	return oidc.NewLogin(a, lo)
}

// selectDriver picks exactly one driver: --compute-driver-socket (remote),
// the configured list, or the probe order.
func selectDriver(ctx context.Context, cfg *config.Config, logger *slog.Logger, callback string) (string, compute.Driver, error) {
	names := cfg.Drivers
	if len(names) > 1 {
		return "", nil, errdefs.InvalidArgument(fmt.Sprintf("exactly one compute driver must be active, got %s", strings.Join(names, ",")))
	}
	name := ""
	if len(names) == 1 {
		name = names[0]
	}
	socket := cfg.ComputeDriverSocket
	if name != "" && socket == "" {
		if s, ok := cfg.DriverConfigs[name]["socket_path"].(string); ok {
			socket = s
		}
	}
	if socket != "" {
		if name == "" {
			name = "remote"
		}
		d, err := remote.Dial(ctx, socket, logger)
		if err != nil {
			return "", nil, fmt.Errorf("compute driver %s at %s: %w", name, socket, err)
		}
		return name, d, nil
	}
	if name == "" {
		name = probeDriver()
	}
	reg := drivers()
	d, err := reg.New(name, cfg.DriverConfigs[name], compute.FactoryDeps{
		Logger: logger, StateDir: cfg.StateDir, GatewayEndpoint: callback, SupervisorPath: supervisorPath(),
		SupervisorEnv: supervisorOTLPEnv(cfg),
	})
	if err != nil {
		return "", nil, fmt.Errorf("compute driver %s: %w", name, err)
	}
	return name, d, nil
}

// probeDriver: kubernetes when in-cluster, else the process driver.
// Docker is used only when asked for (--drivers docker).
func probeDriver() string {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return "kubernetes"
	}
	return "process"
}

// supervisorPath finds openshell-sandbox next to this executable.
func supervisorPath() string {
	if p := os.Getenv("OPENSHELL_SUPERVISOR_PATH"); p != "" {
		return p
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), "openshell-sandbox")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func ensureDefaultWorkspace(ctx context.Context, st store.Store) error {
	ws := &datamodelv1.Workspace{
		Metadata: &datamodelv1.ObjectMeta{Id: "workspace-" + lifecycle.DefaultWorkspace, Name: lifecycle.DefaultWorkspace},
		Status:   &datamodelv1.WorkspaceStatus{Phase: datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE},
	}
	if _, err := st.Create(ctx, store.TypeWorkspace, ws); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
		return fmt.Errorf("ensure default workspace: %w", err)
	}
	return nil
}

// runDriver implements `openshell-gateway driver serve --driver NAME --socket PATH`:
// any in-tree driver served over openshell.compute.v1 on a Unix socket.
func runDriver(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "serve" {
		_, _ = fmt.Fprintln(stderr, "usage: openshell-gateway driver serve --driver NAME --socket PATH [--state-dir DIR] [--gateway-endpoint URL] [--config FILE]")
		return &usageError{"unknown driver subcommand"}
	}
	fs := flag.NewFlagSet("openshell-gateway driver serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("driver", "", "driver to serve (process)")
	socket := fs.String("socket", "", "Unix socket path to listen on")
	stateDir := fs.String("state-dir", "", "state directory (default $XDG_STATE_HOME/openshell/driver-<name>)")
	endpoint := fs.String("gateway-endpoint", "", "gateway endpoint sandboxes dial back to")
	cfgFile := fs.String("config", "", "gateway.toml whose [openshell.drivers.NAME] table (with the inherited [openshell.gateway] keys) configures the driver")
	level := fs.String("log-level", "info", "log level")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *name == "" || *socket == "" {
		return &usageError{"--driver and --socket are required"}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return &usageError{"invalid --log-level " + strconv.Quote(*level)}
	}
	logger := newLogger(stderr, lv)
	dir := *stateDir
	if dir == "" {
		base := os.Getenv("XDG_STATE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".local", "state")
		}
		dir = filepath.Join(base, "openshell", "driver-"+*name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var table map[string]any
	if *cfgFile != "" {
		var err error
		if table, err = driverTable(*cfgFile, *name); err != nil {
			return err
		}
	}
	tracing := setupDriverTracing(ctx, *cfgFile, *name, logger)
	defer flushTracing(tracing, logger)
	d, err := drivers().New(*name, table, compute.FactoryDeps{Logger: logger, StateDir: dir, GatewayEndpoint: *endpoint, SupervisorPath: supervisorPath(),
		SupervisorEnv: fileSupervisorOTLPEnv(*cfgFile)})
	if err != nil {
		return err
	}
	if c, ok := d.(io.Closer); ok {
		defer c.Close()
	}
	_, _ = fmt.Fprintf(stdout, "serving compute driver %s on %s\n", *name, *socket)
	return remote.Serve(ctx, d, *socket, logger)
}

// driverTable reads [openshell.drivers.<name>] from a gateway.toml, with
// the allowlisted [openshell.gateway] keys inherited as the gateway itself
// does, so a separately served driver sees the same configuration.
func driverTable(path, name string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("driver config: %w", err)
	}
	var doc struct {
		OpenShell struct {
			Gateway map[string]any            `toml:"gateway"`
			Drivers map[string]map[string]any `toml:"drivers"`
		} `toml:"openshell"`
	}
	if err := toml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("driver config %s: %w", path, err)
	}
	table := map[string]any{}
	for _, k := range config.InheritedDriverKeys(name) {
		if v, ok := doc.OpenShell.Gateway[k]; ok {
			table[k] = v
		}
	}
	for k, v := range doc.OpenShell.Drivers[name] {
		if k == "socket_path" { // where the gateway finds this driver, not driver config
			continue
		}
		table[k] = v
	}
	return table, nil
}

// loadKEK returns the key-encryption key of provider credentials, from
// exactly one source: the environment variable, a Kubernetes Secret
// (created when absent and allowed) or a file (created 0600 on first
// start), with the previous keys of a rotation added. It also returns how
// many previous keys there are.
func loadKEK(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*credentials.Keyring, int, error) {
	var cur *credentials.Keyring
	var prev []*credentials.Keyring
	switch {
	case cfg.CredentialsKEK != "":
		kek, err := credentials.ParseKEK(cfg.CredentialsKEK)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", config.EnvCredentialsKEK, err)
		}
		if cur, err = credentials.NewKeyring(kek); err != nil {
			return nil, 0, err
		}
	case cfg.CredentialsKEKSecret != "":
		keys, err := loadKEKSecret(ctx, cfg)
		if err != nil {
			return nil, 0, err
		}
		cur, prev = keys.Current, keys.Previous
		if keys.Created {
			logger.Info("created the key-encryption key secret", "secret", cfg.CredentialsKEKSecret, "data_key", cfg.CredentialsKEKSecretKey, "kek_id", cur.ID())
		}
	default:
		var err error
		if cur, err = credentials.LoadOrCreateKEK(cfg.CredentialsKEKFile); err != nil {
			return nil, 0, err
		}
	}
	for _, f := range cfg.CredentialsPreviousKEKFiles {
		k, err := credentials.LoadKEKFile(f)
		if err != nil {
			return nil, 0, fmt.Errorf("--credentials-previous-kek-file: %w", err)
		}
		prev = append(prev, k)
	}
	for i, v := range cfg.CredentialsPreviousKEKs {
		kek, err := credentials.ParseKEK(v)
		if err != nil {
			return nil, 0, fmt.Errorf("%s (entry %d): %w", config.EnvCredentialsPreviousKEK, i+1, err)
		}
		k, err := credentials.NewKeyring(kek)
		if err != nil {
			return nil, 0, err
		}
		prev = append(prev, k)
	}
	if len(prev) == 0 {
		return cur, 0, nil
	}
	return cur.WithPrevious(prev...), len(prev), nil
}

// loadKEKSecret reads (or creates) the --credentials-kek-secret Secret with
// the kubernetes driver's kubeconfig when one is configured, else the
// in-cluster configuration.
func loadKEKSecret(ctx context.Context, cfg *config.Config) (credk8s.Keys, error) {
	ns, name, err := credk8s.ParseRef(cfg.CredentialsKEKSecret)
	if err != nil {
		return credk8s.Keys{}, fmt.Errorf("--credentials-kek-secret: %w", err)
	}
	if err := credk8s.ValidKey(cfg.CredentialsKEKSecretKey); err != nil {
		return credk8s.Keys{}, fmt.Errorf("--credentials-kek-secret-key: %w", err)
	}
	kubeconfig, _ := cfg.DriverConfigs["kubernetes"]["kubeconfig"].(string)
	var rc *rest.Config
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if rc, err = rest.InClusterConfig(); err != nil {
		err = fmt.Errorf("%w (outside a cluster, set kubeconfig in [openshell.drivers.kubernetes])", err)
	}
	if err != nil {
		return credk8s.Keys{}, fmt.Errorf("--credentials-kek-secret: kubernetes client: %w", err)
	}
	rc.UserAgent = "openshell-gateway/" + version.Version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return credk8s.Keys{}, fmt.Errorf("--credentials-kek-secret: kubernetes client: %w", err)
	}
	s := &credk8s.Secret{Client: client, Namespace: ns, Name: name, Key: cfg.CredentialsKEKSecretKey}
	return s.Load(ctx)
}

// rewrapCredentials moves credentials wrapped under previous KEKs to the
// current one when a rotation is configured (nPrev previous keys).
func rewrapCredentials(ctx context.Context, nPrev int, logger *slog.Logger, provs *providers.Store) error {
	if nPrev == 0 {
		return nil
	}
	n, err := provs.RewrapAll(ctx)
	if err != nil {
		return fmt.Errorf("re-wrap provider credentials under the current key-encryption key: %w", err)
	}
	logger.Info("provider credentials re-wrapped under the current key-encryption key", "objects", n)
	return nil
}
