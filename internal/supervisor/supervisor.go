// Package supervisor is openshell-sandbox, the supervisor that runs inside
// every sandbox workload.
//
// It authenticates to the gateway with the sandbox's JWT, fetches (or
// seeds) the sandbox policy, keeps one ConnectSupervisor session open with
// heartbeats and reconnects, serves RelayOpen requests by dialing its own
// SSH server (a Unix socket inside the sandbox) or a loopback TCP port and
// pumping the bytes over a RelayStream call, launches the sandbox's main
// process and reports its exit, and streams its own log lines and the main
// process's output with PushSandboxLogs. Its egress proxy submits the
// denials it saw to the policy advisor (advisor.go) and serves the
// agents' policy.local API (policylocal.go, docs/policy.md).
//
// Run is the command entry point (configuration from OPENSHELL_* variables,
// see docs/supervisor.md); Serve runs a supervisor from a Config built in
// code.
package supervisor

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/version"
)

// Config is a supervisor's configuration.
type Config struct {
	// Endpoint is the gateway: http://host:port, https://host:port or
	// unix:///path.
	Endpoint string
	// TLS material for https endpoints: CA bundle, and an optional client
	// certificate and key.
	TLSCA, TLSCert, TLSKey string

	SandboxID   string
	SandboxName string // for the policy sync; defaults to SandboxID
	InstanceID  string // defaults to a new UUID

	// Identity, first non-empty wins: TokenFile, Token, K8sSATokenFile
	// (exchanged through IssueSandboxToken).
	TokenFile      string
	Token          string
	K8sSATokenFile string

	// WorkspaceDir is the working directory of the main process and of
	// SSH sessions. Empty means the current directory.
	WorkspaceDir string
	// Command is the main process argv; empty means /bin/bash -l (or
	// /bin/sh). TTY runs it on a pseudo terminal.
	Command []string
	TTY     bool
	// NoMainProcess skips the main process (tests of the relay alone).
	NoMainProcess bool

	// SSHSocket is the Unix socket of the SSH server; empty means a fresh
	// private directory under the temp dir.
	SSHSocket string

	// StartupTimeout bounds the initial GetSandboxConfig retries.
	StartupTimeout time.Duration
	// ReconnectMin/Max bound the session reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration

	// Process-driver contract (Linux, new namespaces): hostname to set,
	// a root of its own (PrivateTmp: assembled from the host's system
	// directories; Rootfs: an image directory, with its writable layer
	// in RootfsLayer).
	Hostname    string
	PrivateTmp  bool
	Rootfs      string
	RootfsLayer string
	// PrivateNetwork: the driver started the supervisor in a network
	// namespace of its own; the supervisor brings up loopback and refuses
	// to start when it sees any other interface. The gateway must then be
	// a unix:// endpoint (reachable from any network namespace).
	PrivateNetwork bool
	// EgressDialerFD is the inherited descriptor of the driver's host
	// dialer (0: none). With PrivateNetwork it enables the egress proxy.
	EgressDialerFD int
	// EgressDialerSocket is the name of the driver's dialer socket in the
	// directory of the unix:// gateway socket ("": none): the supervisor
	// reconnects its host dialer there when the inherited channel breaks
	// (the gateway restarted). See EnvEgressDialerSocket.
	EgressDialerSocket string
	// EgressDialerPath is the absolute path of the driver's dialer socket
	// when no descriptor is inherited (Docker). See EnvEgressDialerPath.
	EgressDialerPath string
	// EgressFence, "nftables" or empty, is the Kubernetes contract: the
	// supervisor shares the pod's network namespace with the agent, runs
	// the egress proxy dialing upstream itself, and fences agent
	// processes off everything else (see EnvEgressFence).
	EgressFence string
	// EgressTestHosts is the test-only resolver override of the egress
	// proxy ("name=ip,..."); see EnvEgressTestHosts.
	EgressTestHosts string
	// EgressTestCAFile is a test-only PEM bundle the egress proxy trusts,
	// besides the system roots, for upstreams of terminated TLS; see
	// EnvEgressTestCAFile.
	EgressTestCAFile string

	// ReapAll makes the supervisor reap every child it inherits (PID 1).
	ReapAll bool
	// LogBuffer bounds the lines waiting for PushSandboxLogs.
	LogBuffer int
	// LogLevel of the supervisor's own log.
	LogLevel slog.Level
	// DenialFlushInterval is how often the egress proxy's denials go to
	// the policy advisor (default 10 s, OpenShell's; see
	// EnvDenialFlushInterval).
	DenialFlushInterval time.Duration

	// MetricsListen is the address of the Prometheus /metrics listener
	// ("": none), in the supervisor's network namespace; a non-loopback
	// host needs MetricsAllowRemote (flags --metrics-listen and
	// --metrics-allow-remote).
	MetricsListen      string
	MetricsAllowRemote bool

	// OnSessionAccepted, when set, is called after each SessionAccepted.
	OnSessionAccepted func(sessionID string)

	agentEnv      []string              // set by Serve: the egress proxy variables
	upstreamRoots func() *x509.CertPool // read by Serve before the namespace setup, parsed on first use
	credentials   egress.Credentials    // set by Serve: the provider placeholder resolver
	egressMetrics *egress.Metrics       // set by Serve: the proxy's decision counters
	policyLocal   *policyLocal          // set by Serve: serves policy.local through the proxy
	beforePivot   func()                // set by Serve: called before enterSandboxRoot's pivot_root

	k8sSAToken string // preloaded from K8sSATokenFile
}

// Environment variables read by ConfigFromEnv.
const (
	EnvEndpoint       = "OPENSHELL_ENDPOINT"
	EnvTLSCA          = "OPENSHELL_TLS_CA"
	EnvTLSCert        = "OPENSHELL_TLS_CERT"
	EnvTLSKey         = "OPENSHELL_TLS_KEY"
	EnvSandboxID      = "OPENSHELL_SANDBOX_ID"
	EnvSandboxName    = "OPENSHELL_SANDBOX_NAME"
	EnvInstanceID     = "OPENSHELL_INSTANCE_ID"
	EnvToken          = "OPENSHELL_SANDBOX_TOKEN"
	EnvTokenFile      = "OPENSHELL_SANDBOX_TOKEN_FILE"
	EnvK8sSATokenFile = "OPENSHELL_K8S_SA_TOKEN_FILE"
	EnvWorkspaceDir   = "OPENSHELL_WORKSPACE_DIR"
	EnvCommand        = "OPENSHELL_SANDBOX_COMMAND"
	EnvTTY            = "OPENSHELL_SANDBOX_TTY"
	EnvSSHSocket      = "OPENSHELL_SSH_SOCKET"
	EnvStartupTimeout = "OPENSHELL_STARTUP_TIMEOUT"
	EnvHostname       = "OPENSHELL_SANDBOX_HOSTNAME"
	EnvPrivateTmp     = "OPENSHELL_PRIVATE_TMP"
	EnvPrivateNetwork = "OPENSHELL_PRIVATE_NETWORK"
	EnvRootfs         = "OPENSHELL_ROOTFS"
	EnvRootfsLayer    = "OPENSHELL_ROOTFS_LAYER"
	EnvLogLevel       = "OPENSHELL_LOG_LEVEL"
	// EnvDenialFlushInterval is OpenShell's variable for the seconds
	// between two submissions of denials to the policy advisor.
	EnvDenialFlushInterval = "OPENSHELL_DENIAL_FLUSH_INTERVAL_SECS"
)

// secretEnv are never passed to processes in the sandbox (the token
// file's path only tells where the secret is kept).
// The egress variables are the supervisor's own business as well.
var secretEnv = []string{EnvToken, EnvTokenFile, EnvTLSKey, EnvEgressDialerFD, EnvEgressDialerSocket, EnvEgressDialerPath, EnvEgressTestHosts, EnvEgressTestCAFile, EnvEgressFence}

// ConfigFromEnv builds a Config from OPENSHELL_* variables.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Endpoint:       getenv(EnvEndpoint),
		TLSCA:          getenv(EnvTLSCA),
		TLSCert:        getenv(EnvTLSCert),
		TLSKey:         getenv(EnvTLSKey),
		SandboxID:      getenv(EnvSandboxID),
		SandboxName:    getenv(EnvSandboxName),
		InstanceID:     getenv(EnvInstanceID),
		Token:          getenv(EnvToken),
		TokenFile:      getenv(EnvTokenFile),
		K8sSATokenFile: getenv(EnvK8sSATokenFile),
		WorkspaceDir:   getenv(EnvWorkspaceDir),
		SSHSocket:      getenv(EnvSSHSocket),
		Hostname:       getenv(EnvHostname),
		Rootfs:         getenv(EnvRootfs),
		RootfsLayer:    getenv(EnvRootfsLayer),

		EgressFence:      getenv(EnvEgressFence),
		EgressTestHosts:  getenv(EnvEgressTestHosts),
		EgressTestCAFile: getenv(EnvEgressTestCAFile),
	}
	var err error
	if v := getenv(EnvCommand); v != "" {
		if err := json.Unmarshal([]byte(v), &c.Command); err != nil {
			return c, fmt.Errorf("%s must be a JSON array of strings: %w", EnvCommand, err)
		}
	}
	if c.TTY, err = envBool(getenv, EnvTTY); err != nil {
		return c, err
	}
	if c.PrivateTmp, err = envBool(getenv, EnvPrivateTmp); err != nil {
		return c, err
	}
	if c.PrivateNetwork, err = envBool(getenv, EnvPrivateNetwork); err != nil {
		return c, err
	}
	if v := getenv(EnvEgressDialerFD); v != "" {
		if c.EgressDialerFD, err = strconv.Atoi(v); err != nil || c.EgressDialerFD < 3 {
			return c, fmt.Errorf("%s: %q is not an inherited descriptor (3 or more)", EnvEgressDialerFD, v)
		}
	}
	if v := getenv(EnvEgressDialerSocket); v != "" {
		if strings.Contains(v, "/") || v == "." || v == ".." {
			return c, fmt.Errorf("%s: %q is not a file name", EnvEgressDialerSocket, v)
		}
		if c.EgressDialerFD == 0 || !strings.HasPrefix(c.Endpoint, "unix://") {
			return c, fmt.Errorf("%s needs %s and a unix:// %s", EnvEgressDialerSocket, EnvEgressDialerFD, EnvEndpoint)
		}
		c.EgressDialerSocket = v
	}
	if v := getenv(EnvEgressDialerPath); v != "" {
		if !filepath.IsAbs(v) || filepath.Clean(v) != v {
			return c, fmt.Errorf("%s: %q is not a clean absolute path", EnvEgressDialerPath, v)
		}
		if c.EgressDialerFD != 0 {
			return c, fmt.Errorf("%s cannot be combined with %s", EnvEgressDialerPath, EnvEgressDialerFD)
		}
		c.EgressDialerPath = v
	}
	if v := getenv(EnvStartupTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			secs, serr := strconv.Atoi(v)
			if serr != nil {
				return c, fmt.Errorf("%s: %q is not a duration", EnvStartupTimeout, v)
			}
			d = time.Duration(secs) * time.Second
		}
		c.StartupTimeout = d
	}
	if v := getenv(EnvDenialFlushInterval); v != "" {
		secs, err := strconv.ParseUint(v, 10, 32)
		if err != nil || secs == 0 {
			return c, fmt.Errorf("%s: %q is not a positive number of seconds", EnvDenialFlushInterval, v)
		}
		c.DenialFlushInterval = time.Duration(secs) * time.Second
	}
	if v := getenv(EnvLogLevel); strings.EqualFold(v, "trace") {
		c.LogLevel = slog.LevelDebug - 4 // the gateway accepts OpenShell's trace level
	} else if v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return c, fmt.Errorf("%s: %w", EnvLogLevel, err)
		}
	}
	return c, nil
}

func envBool(getenv func(string) string, k string) (bool, error) {
	v := getenv(k)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not a boolean", k, v)
	}
	return b, nil
}

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if c.Endpoint == "" {
		return fmt.Errorf("%s is required", EnvEndpoint)
	}
	if c.SandboxID == "" {
		return fmt.Errorf("%s is required", EnvSandboxID)
	}
	if c.PrivateNetwork && !strings.HasPrefix(c.Endpoint, "unix://") {
		return fmt.Errorf("%s needs a unix:// gateway endpoint (a private network namespace has loopback only), got %s", EnvPrivateNetwork, c.Endpoint)
	}
	if err := checkMetricsListen(c.MetricsListen, c.MetricsAllowRemote); err != nil {
		return err
	}
	switch {
	case c.EgressFence != "" && c.EgressFence != egressFenceNftables:
		return fmt.Errorf("%s: %q is not a fence this supervisor installs (only %q)", EnvEgressFence, c.EgressFence, egressFenceNftables)
	case c.EgressFence != "" && (c.PrivateNetwork || c.EgressDialerFD != 0 || c.EgressDialerPath != ""):
		return fmt.Errorf("%s is for a supervisor sharing the agent's network namespace; it cannot be combined with %s, %s or %s", EnvEgressFence, EnvPrivateNetwork, EnvEgressDialerFD, EnvEgressDialerPath)
	}
	if c.Rootfs != "" && c.RootfsLayer == "" {
		return fmt.Errorf("%s is required with %s (the image itself is never written)", EnvRootfsLayer, EnvRootfs)
	}
	if c.SandboxName == "" {
		c.SandboxName = c.SandboxID
	}
	if c.InstanceID == "" {
		c.InstanceID = uuid.NewString()
	}
	if c.StartupTimeout <= 0 {
		c.StartupTimeout = 2 * time.Minute
	}
	if c.DenialFlushInterval <= 0 {
		c.DenialFlushInterval = defaultDenialFlushInterval
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 500 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 30 * time.Second
	}
	return nil
}

// Run runs openshell-sandbox with args (without the program name),
// configured from the environment.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "copy-self" {
		return copySelf(args[1:], stdout)
	}
	if len(args) > 0 && args[0] == sftpServerCmd {
		return runSFTPServer(args[1:])
	}
	fs := flag.NewFlagSet("openshell-sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr) }
	showVersion := fs.Bool("version", false, "print the version and exit")
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus /metrics on this loopback host:port")
	metricsAllowRemote := fs.Bool("metrics-allow-remote", false, "let --metrics-listen take a non-loopback address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		_, _ = fmt.Fprintf(stdout, "openshell-sandbox %s\n", version.Version)
		return nil
	}
	if err := checkMetricsListen(*metricsListen, *metricsAllowRemote); err != nil {
		return err
	}
	sealInheritedFDs()
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	cfg.MetricsListen, cfg.MetricsAllowRemote = *metricsListen, *metricsAllowRemote
	cfg.ReapAll = os.Getpid() == 1
	return Serve(ctx, cfg, stdout, stderr)
}

// ExitCode maps an error returned by Run to a process exit code.
func ExitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}

// Serve runs a supervisor until ctx ends or startup fails. The supervisor's
// log goes to stderr and to the gateway; the main process's output goes to
// stdout/stderr and to the gateway.
func Serve(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	startup := newStartupClock()
	if err := cfg.Validate(); err != nil {
		return err
	}
	gcResume := deferGC()
	defer gcResume()
	hostKey := generateHostKey()
	// Everything read from the filesystem before the namespace setup (which
	// may hide /tmp behind a private tmpfs) is read now: credentials, TLS
	// material, and a handle on the gateway socket's directory.
	if err := preloadCredentials(&cfg); err != nil {
		return err
	}
	// The roots terminated TLS is verified against upstream: the
	// supervisor's system roots (a root filesystem pivoted into later
	// does not change them), read in the background while the sandbox
	// root is assembled (the pivot waits for the reading) and parsed
	// at the first TLS upstream.
	roots, err := loadUpstreamRoots(cfg.EgressTestCAFile)
	if err != nil {
		return err
	}
	cfg.upstreamRoots = roots.wait
	var rootsWait, connWait time.Duration
	var conn *grpc.ClientConn
	cfg.beforePivot = func() {
		t0 := time.Now()
		roots.waitRead()
		rootsWait = time.Since(t0)
		// No dial may be under way while pivot_root moves the path
		// the endpoint names (/proc/self/fd/N/...): a connection
		// made now survives it; a failed one is retried after.
		t0 = time.Now()
		settleConnection(conn, connectSettleTimeout)
		connWait = time.Since(t0)
	}
	startup.mark("roots")
	// Before anything can inherit it.
	dialer, err := takeEgressDialer(&cfg)
	if err != nil {
		return err
	}
	tracing := setupTelemetry(ctx, cfg, stderr, dialer)
	defer telemetry.FlushSupervisor(tracing, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))
	keep, err := pinUnixEndpoint(&cfg)
	if err != nil {
		if dialer != nil {
			_ = dialer.Close()
		}
		return err
	}
	if keep != nil {
		defer keep.Close()
	}
	ts := &tokenSource{}
	conn, err = dialGateway(cfg, ts)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The connection is made while the sandbox root is assembled (see
	// beforePivot).
	conn.Connect()
	client := openshellv1.NewOpenShellClient(conn)

	var pusher *logPusher
	baseHandler := slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel})
	pusher = newLogPusher(client, cfg.SandboxID, cfg.LogBuffer)
	log := slog.New(&teeHandler{inner: baseHandler, pusher: pusher}).With("sandbox_id", cfg.SandboxID)

	// The reaper outlives everything that waits for a child (deferred
	// Close runs after wg.Wait below).
	procs := newProcTable(cfg.ReapAll)
	defer procs.Close()
	// The fence goes last, after everything that waits for an agent.
	var eg *egressRunner
	defer func() { eg.removeFence(log) }()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Shutdown runs in reverse start order through this stack.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	tok, err := loadToken(ctx, &cfg, client)
	if err != nil {
		log.Error("cannot obtain a sandbox identity", "err", err)
		return err
	}
	if tok == "" {
		log.Warn("no sandbox token configured; calling the gateway without credentials")
	}
	ts.set(tok)
	wg.Go(func() { refreshLoop(ctx, log.With("component", "token"), ts, client) })
	wg.Go(func() { pusher.run(ctx) })
	startup.mark("token")
	// The configuration is fetched (and the default policy seeded) while
	// the sandbox root is assembled; it is applied once the egress proxy
	// runs (bootstrapConfig).
	fetched := startConfigFetch(ctx, log.With("component", "config"), client, cfg, &wg)

	if err := setupNamespaces(&cfg); err != nil {
		return err
	}
	if cfg.WorkspaceDir != "" {
		if fi, err := os.Stat(cfg.WorkspaceDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("workspace directory %s is not usable (a private /tmp hides paths under /tmp): %v", cfg.WorkspaceDir, err) //nolint:errorlint // err is nil when the path is not a directory
		}
	}
	startup.mark("namespaces")
	startup.note("roots_wait", rootsWait)
	startup.note("connect_wait", connWait)
	log.Info("openshell-sandbox starting", "version", version.Version, "instance_id", cfg.InstanceID, "endpoint", cfg.Endpoint)
	workdir := cfg.WorkspaceDir
	if workdir == "" {
		workdir, _ = os.Getwd()
	}
	agents := newAgentLauncher(log.With("component", "isolation"), workdir)
	// Provider credentials: the egress proxy resolves the placeholders
	// agent processes see.
	penv := newProviderEnv()
	cfg.credentials = penv.creds
	// Provider credentials reach agent processes as placeholders. As in
	// OpenShell, a failure here is not fatal: the sandbox starts without
	// them and the refresh loop keeps trying. Fetched while the rest
	// starts; nothing reads them before the SSH server and the main
	// process (which wait for it).
	penvDone := make(chan struct{})
	wg.Go(func() {
		defer close(penvDone)
		if _, err := penv.fetch(ctx, client, cfg.SandboxID); err != nil {
			log.Warn("cannot read the provider environment; starting without it", "err", err)
		}
	})
	reg := newMetricsRegistry()
	if cfg.egressMetrics, err = egress.NewMetrics(reg); err != nil {
		return err
	}
	if cfg.MetricsListen != "" {
		if err := serveMetrics(ctx, log.With("component", "metrics"), cfg.MetricsListen, reg, &wg); err != nil {
			log.Error("cannot serve metrics", "err", err)
			return err
		}
	}
	pl := newPolicyLocal(ctx, log.With("component", "policy.local"), client, cfg.SandboxName)
	cfg.policyLocal = pl
	// The egress proxy starts (its CA made) while the
	// configuration is fetched; prepare waits for it. Serve's deferred
	// calls wait for it before wg.Wait.
	egReady := make(chan struct{})
	ecfg := cfg
	var inferenceReady func()
	var egTook time.Duration
	go func() {
		defer close(egReady)
		t0 := time.Now()
		eg = startEgress(ctx, log.With("component", "egress"), ecfg, dialer, &wg)
		egTook = time.Since(t0)
		inferenceReady = pollInference(ctx, &wg, conn, eg.inference)
	}()
	defer func() { <-egReady; eg.close() }()
	// policy.local reports a rule enforced once the proxy installed it.
	prepare := func(p *sandboxv1.SandboxPolicy) (confErr, netErr error) {
		<-egReady
		confErr, netErr = prepareSandbox(agents, eg, p)
		if netErr == nil {
			pl.setPolicy(p)
		}
		return confErr, netErr
	}
	reload := func(p *sandboxv1.SandboxPolicy) error {
		err := eg.reload(p)
		if err == nil {
			pl.setPolicy(p)
		}
		return err
	}
	loaded, err := bootstrapConfig(ctx, log.With("component", "config"), client, cfg, fetched, prepare)
	if err != nil {
		log.Error("giving up on the sandbox configuration", "err", err)
		return err
	}
	startup.mark("config")
	<-egReady // prepare waited for it, unless the gateway sent no policy
	startup.note("egress", egTook)
	cfg.agentEnv = eg.env
	ocsf, err := newOCSFLog(log.With("component", "ocsf"), cfg.SandboxID, sandboxLogDir, nil)
	if err != nil {
		return err
	}
	pusher.setTap(ocsf.observe)
	wg.Go(func() { ocsf.run(ctx) })
	settings := func(s map[string]*sandboxv1.EffectiveSetting) { pl.setSettings(s); ocsf.setSettings(s) }
	settings(loaded.settings)
	wg.Go(func() {
		watchPolicy(ctx, log.With("component", "config"), client, cfg.SandboxID, loaded, policyPollInterval, reload, settings)
	})
	if eg.proxy != nil {
		wg.Go(func() {
			submitDenials(ctx, log.With("component", "advisor"), client, cfg.SandboxID, cfg.SandboxName, eg.proxy.Denials, cfg.DenialFlushInterval)
		})
	}

	<-penvDone
	inferenceReady()
	wg.Go(func() {
		penv.refreshLoop(ctx, log.With("component", "providers"), client, cfg.SandboxID, providerEnvRefresh)
	})
	// The egress proxy's variables win over a same-named provider key.
	startup.mark("providers_inference")
	agentEnv := func() []string { return childEnv(overlay(penv.list(), cfg.agentEnv)) }

	sockPath := cfg.SSHSocket
	if sockPath == "" {
		dir, err := os.MkdirTemp("", "openshell-ssh-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }() // best-effort cleanup of the private socket dir
		sockPath = filepath.Join(dir, "ssh.sock")
	}
	ln, err := listenUnix(sockPath)
	if err != nil {
		return fmt.Errorf("ssh server socket: %w", err)
	}
	srv, err := newSSHServer(log.With("component", "ssh"), hostKey, procs, agents, cfg.WorkspaceDir, agentEnv, loginShell())
	if err != nil {
		ln.Close()
		return err
	}
	wg.Go(func() { srv.serve(ln) })
	defer ln.Close()

	startup.mark("ssh_server")
	// Collection resumes once the gateway accepted the session (the
	// sandbox is READY then), or after gcResumeAfter without one.
	gcTimer := time.AfterFunc(gcResumeAfter, gcResume)
	defer gcTimer.Stop()
	log.Debug("supervisor startup", startup.fields()...)
	sc := &sessionClient{
		log:        log.With("component", "session"),
		client:     client,
		sandboxID:  cfg.SandboxID,
		instanceID: cfg.InstanceID,
		sshSocket:  sockPath,
		onAccepted: func(id string) {
			gcResume()
			<-egReady
			eg.prepareDecision(&wg)
			if cfg.OnSessionAccepted != nil {
				cfg.OnSessionAccepted(id)
			}
		},
	}
	wg.Go(func() {
		reconnectLoop(ctx, sc.log, newBackoff(cfg.ReconnectMin, cfg.ReconnectMax), sleepCtx, sc.run)
		sc.relays.Wait()
	})

	if !cfg.NoMainProcess {
		wg.Go(func() {
			runMainProcess(ctx, log.With("component", "process"), cfg, agentEnv(), agents, procs, pusher, client, stdout, stderr)
		})
	}
	<-ctx.Done()
	log.Info("openshell-sandbox stopping")
	return nil
}

// childEnv is the supervisor's environment without its secrets, with
// extra ("K=V", the egress proxy variables) replacing any inherited value
// of the same names.
func childEnv(extra []string) []string {
	drop := map[string]bool{}
	for _, s := range secretEnv {
		drop[s] = true
	}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] && !telemetry.IsSupervisorEnv(k) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// loginShell is /bin/bash -l when bash exists, else /bin/sh -l.
func loginShell() []string {
	if _, err := os.Stat("/bin/bash"); err == nil {
		return []string{"/bin/bash", "-l"}
	}
	return []string{"/bin/sh", "-l"}
}

// usage documents the supervisor's command line and its environment
// contract (compute drivers start it with no arguments).
func usage(w io.Writer) {
	_, _ = fmt.Fprint(w, `Usage: openshell-sandbox [--version]
       openshell-sandbox copy-self DESTINATION

openshell-sandbox runs inside every sandbox: it dials the gateway, keeps a
supervisor session, serves SSH over gateway relays and runs the main process.
Compute drivers start it with no arguments and this environment:

  `+EnvEndpoint+`        gateway endpoint: unix:///path, http://host:port or https://host:port
  `+EnvTLSCA+`, `+EnvTLSCert+`, `+EnvTLSKey+`   TLS material for https endpoints
  `+EnvSandboxID+`      sandbox id (required)
  `+EnvSandboxName+`    sandbox name
  `+EnvInstanceID+`     id of this incarnation (default: a new UUID)
  `+EnvTokenFile+`  file holding the sandbox JWT (or `+EnvToken+`)
  `+EnvK8sSATokenFile+`   projected ServiceAccount token, exchanged via IssueSandboxToken
  `+EnvWorkspaceDir+`   workspace directory (working directory of the main process)
  `+EnvCommand+`  main process argv as a JSON array (default /bin/bash -l)
  `+EnvTTY+`      "true" to run the main process on a PTY
  `+EnvSSHSocket+`       Unix socket of the SSH server (default: a private temp dir)
  `+EnvStartupTimeout+`  how long to retry the initial config fetch (default 2m)
  `+EnvHostname+`   hostname to set (own uts namespace)
  `+EnvPrivateTmp+`      "true": pivot into a root of read-only host system directories,
                             private /tmp and /dev, workspace at /sandbox (own mount namespace)
  `+EnvRootfs+`           local root filesystem image to pivot into instead (read-only lower layer);
                             /proc/self/fd/N: an inherited detached mount, or a socket that sends one
  `+EnvRootfsLayer+`     directory holding the image's per-sandbox writable layer (required with `+EnvRootfs+`;
                             /proc/self/fd/N: an inherited detached mount)
  `+EnvPrivateNetwork+`  "true": own network namespace, loopback only (needs a unix:// endpoint)
  `+EnvEgressDialerFD+`  inherited descriptor of the driver's host dialer: with `+EnvPrivateNetwork+`,
                             runs the egress proxy on `+egressProxyAddr+` (see docs/security.md)
  `+EnvEgressDialerPath+`  absolute path of the driver's host dialer socket, instead of `+EnvEgressDialerFD+` (Docker)
  `+EnvEgressFence+`  "nftables": share the agent's network namespace (a pod); run the egress proxy on
                             `+egressProxyAddr+` dialing upstream, and fence agent processes off anything else
                             with an nftables table (needs CAP_NET_ADMIN; see docs/security.md)
  `+EnvEgressTestHosts+`  test only: resolve the proxy's destinations from "name=ip,..." instead of DNS
  `+EnvEgressTestCAFile+`  test only: PEM file of CAs trusted for terminated TLS upstreams besides the system roots
  `+EnvLogLevel+`        log level (trace, debug, info, warn, error)
  `+EnvDenialFlushInterval+`  seconds between two submissions of denials to the policy advisor (default 10)

Flags:
  --version                 print the version and exit
  --metrics-listen ADDR     serve Prometheus /metrics on ADDR (host:port, loopback unless
                            --metrics-allow-remote), in the supervisor's network namespace
  --metrics-allow-remote    let --metrics-listen take a non-loopback address
`)
}
