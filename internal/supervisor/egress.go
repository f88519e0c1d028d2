package supervisor

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
)

// Egress environment contract (process driver).
const (
	// EnvEgressDialerFD is the inherited descriptor of the driver's host
	// dialer (package hostdial).
	EnvEgressDialerFD = "OPENSHELL_EGRESS_DIALER_FD"
	// EnvEgressDialerSocket names the driver's dialer socket in the
	// directory of the unix:// gateway socket, where the supervisor
	// reconnects its host dialer when the inherited channel breaks.
	EnvEgressDialerSocket = "OPENSHELL_EGRESS_DIALER_SOCKET"
	// EnvEgressTestHosts is a test-only resolver override for the egress
	// proxy: "name=ip,name=ip". The process driver passes it only from
	// the gateway's own environment, never from a sandbox spec.
	EnvEgressTestHosts = "OPENSHELL_EGRESS_TEST_HOSTS"
	// EnvEgressTestCAFile is a test-only PEM file of CAs the proxy trusts
	// for upstreams of terminated TLS, besides the system roots. The
	// process driver passes it only from the gateway's own environment.
	EnvEgressTestCAFile = "OPENSHELL_EGRESS_TEST_CA_FILE"
)

// caEnv are the variables naming the CA bundle (system roots plus the
// sandbox CA) for agent processes: OpenSSL and curl, Python requests,
// Node.js (which adds it to its own roots).
var caEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"}

// systemBundles are where distributions keep the system CA bundle (PEM).
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"}

// upstreamRoots is the system pool plus the test-only CA file, if any.
func upstreamRoots(testCAFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if testCAFile != "" {
		b, err := os.ReadFile(testCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvEgressTestCAFile, err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", EnvEgressTestCAFile, testCAFile)
		}
	}
	return pool, nil
}

// writeCABundle writes the system CA bundle (as the agent's filesystem
// has it) followed by ca's certificate to a new root-owned directory
// under /tmp (the sandbox's private /tmp when it has one), readable by
// everyone, and returns the file's path. The CA key is never written.
func writeCABundle(ca *egress.CA) (string, error) {
	var bundle []byte
	for _, p := range systemBundles {
		if b, err := os.ReadFile(p); err == nil {
			bundle = append(b, '\n')
			break
		}
	}
	bundle = append(bundle, ca.CertPEM()...)
	dir, err := os.MkdirTemp("/tmp", "openshell-tls-")
	if err != nil {
		return "", fmt.Errorf("sandbox ca bundle: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("sandbox ca bundle: %w", err)
	}
	file := path.Join(dir, "ca-bundle.pem")
	if err := os.WriteFile(file, bundle, 0o644); err != nil { //nolint:gosec // certificates only, read by agent processes
		return "", fmt.Errorf("sandbox ca bundle: %w", err)
	}
	return file, nil
}

// egressProxyAddr is where agent processes find the proxy: loopback in
// the sandbox's own network namespace.
const egressProxyAddr = "127.0.0.1:3128"

// egressRunner is the supervisor's egress proxy, or why there is none.
type egressRunner struct {
	proxy *egress.Proxy
	why   error    // set when proxy is nil
	env   []string // proxy variables for agent processes
	dial  *hostdial.Client
	log   *slog.Logger
}

// takeEgressDialer takes over the host dialer descriptor before anything
// can inherit it (the client dups it close-on-exec). With a dialer socket
// the client reconnects to it, next to the gateway socket of cfg.Endpoint
// as it is when the channel breaks (pinUnixEndpoint rewrites it later).
func takeEgressDialer(cfg *Config) (*hostdial.Client, error) {
	if cfg.EgressDialerFD == 0 {
		return nil, nil
	}
	var redial func() (*net.UnixConn, error)
	if cfg.EgressDialerSocket != "" {
		redial = func() (*net.UnixConn, error) {
			dir := path.Dir(strings.TrimPrefix(cfg.Endpoint, "unix://"))
			return hostdial.DialSocket(path.Join(dir, cfg.EgressDialerSocket))
		}
	}
	c, err := hostdial.NewClient(os.NewFile(uintptr(cfg.EgressDialerFD), "egress-dialer"), redial)
	if err != nil {
		return nil, fmt.Errorf("%s=%d: %w", EnvEgressDialerFD, cfg.EgressDialerFD, err)
	}
	return c, nil
}

// startEgress starts the proxy when the sandbox has a network namespace
// of its own (the proxy is then the only way out) and a host dialer. It
// denies everything until load installs a policy.
func startEgress(ctx context.Context, log *slog.Logger, cfg Config, dialer *hostdial.Client, wg *sync.WaitGroup) *egressRunner {
	e := &egressRunner{dial: dialer, log: log}
	switch {
	case !cfg.PrivateNetwork:
		e.why = errors.New("no egress proxy runs: the sandbox has no network namespace of its own, so a proxy could be bypassed")
		return e
	case dialer == nil:
		e.why = fmt.Errorf("no egress proxy runs: the driver passed no host dialer (%s), so nothing leaves the sandbox", EnvEgressDialerFD)
		return e
	}
	resolver, err := egressResolver(log, cfg, dialer)
	if err != nil {
		e.why = err
		return e
	}
	ln, err := net.Listen("tcp", egressProxyAddr)
	if err != nil {
		e.why = fmt.Errorf("egress proxy listener %s: %w", egressProxyAddr, err)
		return e
	}
	// The sandbox CA for TLS to protocol rest endpoints: its key lives only in this
	// process's memory.
	ca, err := egress.NewCA("OpenShell sandbox " + cfg.SandboxID)
	if err == nil {
		var bundle string
		if bundle, err = writeCABundle(ca); err == nil {
			for _, k := range caEnv {
				e.env = append(e.env, k+"="+bundle)
			}
		}
	}
	if err != nil {
		ln.Close()
		e.why = fmt.Errorf("no egress proxy runs: %w", err)
		return e
	}
	empty, _ := egress.Compile(nil)
	e.proxy = egress.New(egress.Config{
		Resolver:      resolver,
		Dial:          dialer.Dial,
		Identify:      (&egress.ProcIdentifier{Root: "/proc"}).Identify,
		OnEvent:       func(ev egress.Event) { logEgressEvent(log, ev) },
		CA:            ca,
		UpstreamRoots: cfg.upstreamRoots,
		Credentials:   cfg.credentials,
		Metrics:       cfg.egressMetrics,
	}, empty)
	url := "http://" + egressProxyAddr
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		e.env = append(e.env, k+"="+url, strings.ToLower(k)+"="+url)
	}
	e.env = append(e.env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
	wg.Go(func() {
		if err := e.proxy.Serve(ln); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	})
	context.AfterFunc(ctx, func() { ln.Close() })
	log.Info("egress proxy listening", "addr", egressProxyAddr)
	return e
}

// egressResolver resolves destination names for the proxy: the test-only
// override when set, else the Go resolver of /etc/resolv.conf with its
// DNS traffic (over TCP) sent through the host dialer, since the sandbox
// namespace has no route to any name server.
func egressResolver(log *slog.Logger, cfg Config, dialer *hostdial.Client) (egress.Resolver, error) {
	if cfg.EgressTestHosts != "" {
		r := egress.StaticResolver{}
		for _, kv := range strings.Split(cfg.EgressTestHosts, ",") {
			name, ip, ok := strings.Cut(strings.TrimSpace(kv), "=")
			a, err := netip.ParseAddr(ip)
			if !ok || name == "" || err != nil {
				return nil, fmt.Errorf("%s: entry %q is not name=ip", EnvEgressTestHosts, kv)
			}
			r[strings.ToLower(name)] = append(r[strings.ToLower(name)], a)
		}
		log.Warn("egress proxy uses the test-only resolver override; other names do not resolve", "env", EnvEgressTestHosts)
		return r, nil
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, address string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil, err
		}
		return dialer.Dial(ctx, ap)
	}}, nil
}

// load installs the network policy of p for new connections. It returns
// nil when the proxy enforces every network rule of p, else the reason
// (reported as the revision's load error).
func (e *egressRunner) load(p *sandboxv1.SandboxPolicy) error {
	if e.proxy == nil {
		return e.why
	}
	snap, err := egress.Compile(p.GetNetworkPolicies())
	e.proxy.SetSnapshot(snap) // leaves out what is not enforced: fail closed
	e.logNotes(snap)
	return err
}

// logNotes logs what the network rules enforce less than a reader may
// expect (REST rules of tls skip endpoints do not apply to tunnels).
func (e *egressRunner) logNotes(snap *egress.Snapshot) {
	for _, n := range snap.Notes() {
		if e.log != nil {
			e.log.Warn("network policy applies partly by design", "note", n)
		}
	}
}

// reload installs the network rules of a new policy version for new
// connections, only when the proxy enforces all of them: otherwise the
// previous rules stay in force and the reason is returned.
func (e *egressRunner) reload(p *sandboxv1.SandboxPolicy) error {
	if e.proxy == nil {
		return e.why
	}
	snap, err := egress.Compile(p.GetNetworkPolicies())
	if err != nil {
		return fmt.Errorf("%w; the previous network rules stay in force", err)
	}
	e.proxy.SetSnapshot(snap)
	e.logNotes(snap)
	return nil
}

func (e *egressRunner) close() {
	if e.dial != nil {
		_ = e.dial.Close()
	}
}

func logEgressEvent(log *slog.Logger, ev egress.Event) {
	level := slog.LevelInfo
	if ev.Decision == "deny" {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "egress "+ev.Decision,
		"decision", ev.Decision, "kind", ev.Kind, "binary", ev.Binary, "pid", strconv.Itoa(ev.PID),
		"host", ev.Host, "ip", ev.IP, "port", strconv.FormatUint(uint64(ev.Port), 10),
		"policy", ev.Policy, "method", ev.Method, "path", ev.Path, "reason", ev.Reason)
}
