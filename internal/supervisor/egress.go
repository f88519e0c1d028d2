package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
	supinference "github.com/openshell-go/openshell/internal/supervisor/inference"
	"github.com/openshell-go/openshell/internal/supervisor/isolation"
	"github.com/openshell-go/openshell/internal/supervisor/nftfence"
)

// Egress environment contract (process driver; EnvEgressFence: Kubernetes).
const (
	// EnvEgressDialerFD is the inherited descriptor of the driver's host
	// dialer (package hostdial).
	EnvEgressDialerFD = "OPENSHELL_EGRESS_DIALER_FD"
	// EnvEgressDialerSocket names the driver's dialer socket in the
	// directory of the unix:// gateway socket, where the supervisor
	// reconnects its host dialer when the inherited channel breaks.
	EnvEgressDialerSocket = "OPENSHELL_EGRESS_DIALER_SOCKET"
	// EnvEgressDialerPath is the absolute path of a driver's dialer
	// socket (hostdial.Listen) for a supervisor that inherits no dialer
	// descriptor (the Docker driver, which bind-mounts the socket's
	// directory where only the supervisor may open it). The supervisor
	// connects on the first dial and reconnects whenever the channel
	// breaks (the gateway restarted).
	EnvEgressDialerPath = "OPENSHELL_EGRESS_DIALER_PATH"
	// EnvEgressTestHosts is a test-only resolver override for the egress
	// proxy: "name=ip,name=ip". The process driver passes it only from
	// the gateway's own environment, never from a sandbox spec.
	EnvEgressTestHosts = "OPENSHELL_EGRESS_TEST_HOSTS"
	// EnvEgressTestCAFile is a test-only PEM file of CAs the proxy trusts
	// for upstreams of terminated TLS, besides the system roots. The
	// process driver passes it only from the gateway's own environment.
	EnvEgressTestCAFile = "OPENSHELL_EGRESS_TEST_CA_FILE"
	// EnvEgressFence ("nftables") says the supervisor shares its network
	// namespace with the agent (a Kubernetes pod): it dials upstream
	// itself and fences agent processes off everything but the proxy
	// with an nftables table (package nftfence).
	EnvEgressFence = "OPENSHELL_EGRESS_FENCE"
)

// egressFenceNftables is the one value of EnvEgressFence.
const egressFenceNftables = "nftables"

// errAgentNetworkOpen marks a load error that stands whatever network
// rules the policy has: agent processes reach the pod's network directly,
// so not even "no network_policies, no egress" is enforced.
var errAgentNetworkOpen = errors.New("agent processes are not fenced off the pod's network")

// caEnv are the variables naming the CA bundle (system roots plus the
// sandbox CA) for agent processes: OpenSSL and curl, Python requests,
// Node.js (which adds it to its own roots).
var caEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"}

// systemBundles are where distributions keep the system CA bundle (PEM).
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"}

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

// egressRunner is the supervisor's egress proxy, or why there is none,
// and in fence mode the nftables fence keeping agents on it.
type egressRunner struct {
	proxy *egress.Proxy
	why   error    // set when proxy is nil
	env   []string // proxy variables for agent processes
	dial  *hostdial.Client

	log       *slog.Logger
	fenceMode bool                           // cfg.EgressFence is set
	agent     atomic.Pointer[isolation.User] // fence mode: whom Identify reads /proc as
	fence     *nftfence.Fence                // installed by fenceAgents
	fenceErr  error                          // why fenceAgents failed (wraps errAgentNetworkOpen)
	inference *supinference.Router           // serves inference.local (nil when no proxy runs)

	// snap is the snapshot load installed (its Rego decision prepared by
	// prepareDecision once the sandbox is READY, or by its first decision).
	snap atomic.Pointer[egress.Snapshot]

	// The snapshot of a policy without network rules, compiled in the
	// background from the start; nil done: not prepared.
	noRulesDone chan struct{}
	noRules     *egress.Snapshot
	noRulesErr  error
}

// prepareNoRules compiles the snapshot of a policy without network rules
// in the background.
func (e *egressRunner) prepareNoRules() {
	e.noRulesDone = make(chan struct{})
	go func() {
		defer close(e.noRulesDone)
		e.noRules, e.noRulesErr = egress.Compile(nil)
	}()
}

// compile is egress.Compile of p's network rules, or the snapshot
// prepareNoRules compiled when p has none.
func (e *egressRunner) compile(p *sandboxv1.SandboxPolicy) (*egress.Snapshot, error) {
	if len(p.GetNetworkPolicies()) == 0 && e.noRulesDone != nil {
		<-e.noRulesDone
		return e.noRules, e.noRulesErr
	}
	return egress.Compile(p.GetNetworkPolicies())
}

// takeEgressDialer takes over the host dialer descriptor before anything
// can inherit it (the client dups it close-on-exec). With a dialer socket
// the client reconnects to it, next to the gateway socket of cfg.Endpoint
// as it is when the channel breaks (pinUnixEndpoint rewrites it later).
func takeEgressDialer(cfg *Config) (*hostdial.Client, error) {
	if cfg.EgressDialerPath != "" {
		return hostdial.NewSocketClient(cfg.EgressDialerPath), nil
	}
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
// of its own (the proxy is then the only way out) and a host dialer, or
// in fence mode (the proxy dials upstream itself; fenceAgents makes it
// the agents' only way out). It denies everything until load installs a
// policy.
func startEgress(ctx context.Context, log *slog.Logger, cfg Config, dialer *hostdial.Client, wg *sync.WaitGroup) *egressRunner {
	e := &egressRunner{dial: dialer, log: log, fenceMode: cfg.EgressFence != ""}
	var dial func(context.Context, netip.AddrPort) (net.Conn, error)
	switch {
	case e.fenceMode:
		dial = func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.String())
		}
	case !cfg.PrivateNetwork:
		e.why = errors.New("no egress proxy runs: the sandbox has no network namespace of its own, so a proxy could be bypassed")
		return e
	case dialer == nil:
		e.why = fmt.Errorf("no egress proxy runs: the driver passed no host dialer (%s or %s), so nothing leaves the sandbox", EnvEgressDialerFD, EnvEgressDialerPath)
		return e
	default:
		dial = dialer.Dial
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
	var own []netip.Prefix
	if e.fenceMode {
		own = gatewayAddrs(ctx, log, cfg.Endpoint)
	}
	identify := (&egress.ProcIdentifier{Root: "/proc"}).Identify
	if e.fenceMode || !hasEffectiveCap(unix.CAP_SYS_PTRACE) {
		// A pod, or a Docker container (all capabilities dropped but
		// the few the confinement needs): /proc of agent processes is
		// closed to the supervisor but for the agent's own ids.
		identify = identifyAs(&e.agent, identify)
	}
	e.inference = newInferenceRouter(log.With("component", "inference"), cfg, resolver, dial)
	// No snapshot: the proxy denies every connection ("no network policy
	// loaded") until load installs the policy's. The snapshot of a policy
	// without network rules is compiled meanwhile.
	e.prepareNoRules()
	e.proxy = egress.New(egress.Config{
		Inference:     serveInference(e.inference),
		PolicyLocal:   cfg.policyLocal.serve,
		Resolver:      resolver,
		Dial:          dial,
		Identify:      identify,
		OwnAddrs:      own,
		OnEvent:       func(ev egress.Event) { logEgressEvent(log, ev); cfg.policyLocal.observe(ev) },
		CA:            ca,
		UpstreamRoots: cfg.upstreamRoots,
		Credentials:   cfg.credentials,
		Metrics:       cfg.egressMetrics,
	}, nil)
	proxyURL := "http://" + egressProxyAddr
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		e.env = append(e.env, k+"="+proxyURL, strings.ToLower(k)+"="+proxyURL)
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

// gatewayAddrs are the addresses of a TCP gateway endpoint, which the
// proxy's SSRF guard denies unless an endpoint's allowed_ips names them.
// A name that does not resolve now is logged and left out: the guard's
// private ranges still cover a cluster Service address.
func gatewayAddrs(ctx context.Context, log *slog.Logger, endpoint string) []netip.Prefix {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		return []netip.Prefix{netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		log.Warn("cannot resolve the gateway's addresses for the egress proxy's SSRF guard", "host", u.Hostname(), "err", err)
		return nil
	}
	own := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		own = append(own, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return own
}

// egressResolver resolves destination names for the proxy: the test-only
// override when set; without a host dialer (fence mode) the system
// resolver; else the Go resolver of /etc/resolv.conf with its DNS traffic
// (over TCP) sent through the host dialer, since the sandbox namespace has
// no route to any name server.
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
	if dialer == nil {
		// Never nil: the inference router resolves through it too.
		return net.DefaultResolver, nil
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, address string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil, err
		}
		return dialer.Dial(ctx, ap)
	}}, nil
}

// prepareSandbox builds the agent confinement for p (agents.prepare),
// fences the agents' network in fence mode and installs p's network rules
// in the proxy. A fence that cannot be installed is a confinement error
// (no agent process starts) when p's landlock compatibility, the policy's
// one compatibility setting, is hard_requirement; otherwise agents start
// with the pod's network and the load error says so. Nothing spawns an
// agent before the first prepareSandbox returns (the SSH server and the
// main process start after it).
func prepareSandbox(agents *agentLauncher, e *egressRunner, p *sandboxv1.SandboxPolicy) (confErr, netErr error) {
	confErr = agents.prepare(p)
	if conf := agents.confinement(); conf != nil {
		if err := e.fenceAgents(conf.User); err != nil && conf.HardLandlock {
			confErr = fmt.Errorf("%w (landlock compatibility is %s)", err, isolation.HardRequirement)
			agents.refuse(confErr)
		}
	}
	return confErr, e.load(p)
}

// fenceAgents installs, in fence mode, the nftables fence keeping sockets
// of u's uid and gid on the proxy; its error wraps errAgentNetworkOpen
// and is part of every later load and reload error. The agents' identity
// is fixed at start, so the fence is installed once.
func (e *egressRunner) fenceAgents(u isolation.User) error {
	if e.agent.Load() == nil {
		e.agent.Store(&u) // for identifyAs
	}
	if !e.fenceMode || e.fence != nil || e.fenceErr != nil {
		return e.fenceErr
	}
	f, err := nftfence.Install(nftfence.Config{UID: u.UID, GID: u.GID, Proxy: netip.MustParseAddrPort(egressProxyAddr)})
	if err != nil {
		e.fenceErr = fmt.Errorf("%w: %w", errAgentNetworkOpen, err)
		e.log.Error("cannot fence agent processes off the pod's network", "err", err)
		return e.fenceErr
	}
	e.fence = f
	e.log.Info("agent processes fenced: their only way out is the egress proxy", "table", "inet "+nftfence.TableName, "uid", u.UID, "gid", u.GID, "proxy", egressProxyAddr)
	return nil
}

// hasEffectiveCap reports whether capability c is in the supervisor's
// effective set (false when it cannot be read).
func hasEffectiveCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// identifyAs wraps identify for fence mode and for a supervisor without
// CAP_SYS_PTRACE (Docker). There the supervisor has
// neither CAP_SYS_PTRACE nor CAP_DAC_READ_SEARCH, so /proc/<pid>/fd and
// /proc/<pid>/exe of agent processes (another uid) are closed to it. The
// kernel checks both against the caller's filesystem ids, so identify
// runs on a locked thread whose fsuid and fsgid are the agent's (which
// CAP_SETUID and CAP_SETGID allow), restored before the thread is
// released. Processes of other ids stay unreadable: a socket they hold
// is not identified and the connection is denied.
func identifyAs(agent *atomic.Pointer[isolation.User], identify func(client, server netip.AddrPort) ([]egress.Caller, error)) func(client, server netip.AddrPort) ([]egress.Caller, error) {
	return func(client, server netip.AddrPort) ([]egress.Caller, error) {
		u := agent.Load()
		if u == nil {
			return nil, errors.New("the agent's identity is not known yet")
		}
		runtime.LockOSThread()
		err := setFSIDs(int(u.UID), int(u.GID))
		defer func() {
			// A thread whose ids cannot be restored stays locked and ends
			// with its goroutine.
			if setFSIDs(os.Geteuid(), os.Getegid()) == nil {
				runtime.UnlockOSThread()
			}
		}()
		if err != nil {
			return nil, fmt.Errorf("read the caller's /proc entries as uid %d: %w", u.UID, err)
		}
		return identify(client, server)
	}
}

// setFSIDs sets the calling thread's fsgid and fsuid and checks them
// (the system calls report no error).
func setFSIDs(uid, gid int) error {
	_, _ = unix.SetfsgidRetGid(gid)
	_, _ = unix.SetfsuidRetUid(uid)
	cu, _ := unix.SetfsuidRetUid(-1) // -1 changes nothing and returns the current id
	cg, _ := unix.SetfsgidRetGid(-1)
	if cu != uid || cg != gid {
		return fmt.Errorf("filesystem ids are %d/%d, want %d/%d", cu, cg, uid, gid)
	}
	return nil
}

// withFence adds the fence's error, if any, to a load error.
func (e *egressRunner) withFence(err error) error {
	switch {
	case e.fenceErr == nil:
		return err
	case err == nil:
		return e.fenceErr
	}
	return fmt.Errorf("%w; %w", e.fenceErr, err)
}

// load installs the network policy of p for new connections. It returns
// nil when the proxy enforces every network rule of p (and, in fence
// mode, the fence is installed), else the reason (reported as the
// revision's load error).
func (e *egressRunner) load(p *sandboxv1.SandboxPolicy) error {
	if e.proxy == nil {
		return e.withFence(e.why)
	}
	snap, err := e.compile(p)
	e.proxy.SetSnapshot(snap) // leaves out what is not enforced: fail closed
	e.snap.Store(snap)
	e.logNotes(snap)
	return e.withFence(err)
}

// prepareDecision prepares the Rego decision of the snapshot load
// installed, in the background (wg joins it): the start leaves it for
// after READY (it is the supervisor's own module, the user's rules its
// data: nothing in it can fail on the policy), and a decision made
// before it is done waits for it. A failure is logged; every decision
// of that snapshot then denies.
func (e *egressRunner) prepareDecision(wg *sync.WaitGroup) {
	snap := e.snap.Load()
	if snap == nil {
		return
	}
	wg.Go(func() {
		if err := snap.Prepare(); err != nil && e.log != nil {
			e.log.Error("egress policy decision not prepared: every connection is denied", "err", err)
		}
	})
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
		return e.withFence(e.why)
	}
	snap, err := e.compile(p)
	if err == nil {
		err = snap.Prepare() // before it replaces rules in force
	}
	if err != nil {
		return e.withFence(fmt.Errorf("%w; the previous network rules stay in force", err))
	}
	e.proxy.SetSnapshot(snap)
	e.snap.Store(snap)
	e.logNotes(snap)
	return e.withFence(nil)
}

func (e *egressRunner) close() {
	if e.dial != nil {
		_ = e.dial.Close()
	}
}

// removeFence deletes the fence. Serve calls it last, after every agent
// process it waits for has ended.
func (e *egressRunner) removeFence(log *slog.Logger) {
	if e == nil || e.fence == nil {
		return
	}
	if err := e.fence.Remove(); err != nil {
		log.Warn("cannot remove the nftables fence", "table", nftfence.TableName, "err", err)
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
		"policy", ev.Policy, "method", ev.Method, "path", ev.Path, "reason", ev.Reason, "finding", ev.Finding)
}
