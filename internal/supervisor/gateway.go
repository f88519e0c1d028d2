package supervisor

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// dialGateway creates the gRPC client connection for cfg.Endpoint with ts
// as per-RPC credentials.
func dialGateway(cfg Config, ts *tokenSource) (*grpc.ClientConn, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvEndpoint, err)
	}
	var target string
	var tc credentials.TransportCredentials
	switch u.Scheme {
	case "unix":
		if u.Path == "" {
			return nil, fmt.Errorf("%s: unix endpoint needs a path", EnvEndpoint)
		}
		target = "unix://" + u.Path
		tc = insecure.NewCredentials()
	case "http":
		if u.Host == "" {
			return nil, fmt.Errorf("%s: missing host", EnvEndpoint)
		}
		target = "passthrough:///" + u.Host
		tc = insecure.NewCredentials()
	case "https":
		if u.Host == "" {
			return nil, fmt.Errorf("%s: missing host", EnvEndpoint)
		}
		target = "passthrough:///" + u.Host
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
		if cfg.TLSCA != "" {
			pem, err := os.ReadFile(cfg.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", EnvTLSCA, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: no certificates found", EnvTLSCA)
			}
			tlsCfg.RootCAs = pool
		}
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("client certificate: %w", err)
			}
			tlsCfg.Certificates = []tls.Certificate{cert}
		}
		tc = credentials.NewTLS(tlsCfg)
		ts.secure = true
	default:
		return nil, fmt.Errorf("%s: unsupported scheme %q (want http, https or unix)", EnvEndpoint, u.Scheme)
	}
	return grpc.NewClient(target, append(tracingDialOptions(),
		grpc.WithTransportCredentials(tc),
		grpc.WithPerRPCCredentials(ts),
	)...)
}

// defaultPolicy is the policy a sandbox without one seeds the gateway with:
// the workspace read-write, system directories read-only.
func defaultPolicy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/var/log"},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock: &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
	}
}

// retryable reports whether a startup call may succeed later.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown, codes.NotFound:
		return true
	}
	return false
}

// providersV2Setting is the setting under which the gateway adds the
// network rules of the sandbox's provider profiles to the policy it
// serves (GetSandboxConfig): then the policy served differs from the one
// stored.
const providersV2Setting = "providers_v2_enabled"

// policyHash is the gateway's policy_hash of p: SHA-256 of its
// deterministic encoding, hex.
func policyHash(p *sandboxv1.SandboxPolicy) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// seededConfig is the configuration a sandbox serves once the supervisor
// stored seed as its policy (UpdateConfig answered up) after first
// fetched first, which had no policy: seed at up's version, with
// first's settings. It is nil, and the supervisor fetches the
// configuration again, unless the gateway stored exactly seed (the
// revision's hash is seed's) and serves it as stored: no global policy
// in force and no provider rules added (providers_v2_enabled present
// and off, as composition needs it on).
func seededConfig(first *sandboxv1.GetSandboxConfigResponse, seed *sandboxv1.SandboxPolicy, up *openshellv1.UpdateConfigResponse) *sandboxv1.GetSandboxConfigResponse {
	v2, ok := first.GetSettings()[providersV2Setting]
	if up.GetVersion() == 0 || up.GetPolicyHash() == "" || up.GetPolicyHash() != policyHash(seed) ||
		first.GetPolicySource() == sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL || !ok || v2.GetValue().GetBoolValue() {
		return nil
	}
	resp := proto.Clone(first).(*sandboxv1.GetSandboxConfigResponse)
	resp.Policy, resp.Version, resp.PolicyHash = seed, up.GetVersion(), up.GetPolicyHash()
	// first's config_revision fingerprinted the configuration without
	// the policy; the new one is not known without a fetch.
	resp.ConfigRevision = 0
	return resp
}

// gatewayCall runs a startup call f, retrying transient failures with
// backoff b until ctx ends.
func gatewayCall(ctx context.Context, log *slog.Logger, b *backoff, timeout time.Duration, name string, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if !retryable(err) {
			return fmt.Errorf("%s: %w", name, err)
		}
		d := b.next()
		log.Warn("gateway call failed; retrying", "call", name, "err", err, "backoff", d)
		if sleepCtx(ctx, d) != nil {
			return fmt.Errorf("%s: no success within %s: %w", name, timeout, err)
		}
	}
}

// fetchConfig fetches the sandbox configuration, seeding the default
// policy when the gateway has none (as OpenShell's supervisor): the
// revision the gateway stored is then the policy enforced, taken from
// UpdateConfig's answer when it is exactly the default policy
// (seededConfig), else fetched again. Transient failures are retried
// with backoff until deadline.
func fetchConfig(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, cfg Config, deadline time.Time) (*sandboxv1.GetSandboxConfigResponse, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	b := newBackoff(200*time.Millisecond, 5*time.Second)
	var resp *sandboxv1.GetSandboxConfigResponse
	fetch := func() error {
		var err error
		resp, err = client.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: cfg.SandboxID})
		return err
	}
	if err := gatewayCall(ctx, log, b, cfg.StartupTimeout, "GetSandboxConfig", fetch); err != nil {
		return nil, err
	}
	if resp.GetPolicy() != nil {
		return resp, nil
	}
	log.Info("gateway has no policy for this sandbox; syncing the default policy")
	seed := defaultPolicy()
	var up *openshellv1.UpdateConfigResponse
	if err := gatewayCall(ctx, log, b, cfg.StartupTimeout, "UpdateConfig", func() error {
		var err error
		up, err = client.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: cfg.SandboxName, Policy: seed})
		return err
	}); err != nil {
		return nil, err
	}
	if seeded := seededConfig(resp, seed, up); seeded != nil {
		return seeded, nil
	}
	b.reset()
	if err := gatewayCall(ctx, log, b, cfg.StartupTimeout, "GetSandboxConfig", fetch); err != nil {
		return nil, err
	}
	return resp, nil
}

// configFetch is a fetchConfig running alongside the rest of the start.
type configFetch struct {
	done     chan struct{}
	resp     *sandboxv1.GetSandboxConfigResponse
	err      error
	deadline time.Time
}

// startConfigFetch runs fetchConfig in a goroutine of wg; its deadline is
// cfg.StartupTimeout from now, for the fetch and the report after it.
func startConfigFetch(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, cfg Config, wg *sync.WaitGroup) *configFetch {
	f := &configFetch{done: make(chan struct{}), deadline: time.Now().Add(cfg.StartupTimeout)}
	wg.Go(func() {
		defer close(f.done)
		f.resp, f.err = fetchConfig(ctx, log, client, cfg, f.deadline)
	})
	return f
}

// bootstrapConfig takes the sandbox configuration fetched by f, builds
// the agent confinement from the policy and installs its network rules
// in the egress proxy with prepare, and reports the policy's status:
// LOADED when enforcement accepts every section, FAILED with the reason
// otherwise. A policy that cannot be enforced is not a startup failure:
// the revision says so, and when the confinement itself failed every
// agent spawn fails closed. Transient failures are retried with backoff
// until f's deadline.
func bootstrapConfig(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, cfg Config, f *configFetch, prepare func(*sandboxv1.SandboxPolicy) (confErr, netErr error)) (loadedPolicy, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return loadedPolicy{}, ctx.Err()
	}
	if f.err != nil {
		return loadedPolicy{}, f.err
	}
	resp := f.resp
	ctx, cancel := context.WithDeadline(ctx, f.deadline)
	defer cancel()
	log.Info("sandbox configuration loaded", "policy_version", resp.GetVersion(), "policy_hash", resp.GetPolicyHash())
	confErr, netErr := prepare(resp.GetPolicy())
	if confErr != nil {
		log.Error("cannot confine agent processes as the policy asks; they will not start", "policy_version", resp.GetVersion(), "err", confErr)
	}
	loaded := loadedPolicy{version: resp.GetVersion(), hash: resp.GetPolicyHash(), policy: resp.GetPolicy(), confErr: confErr, settings: resp.GetSettings()}
	if resp.GetVersion() == 0 {
		log.Warn("gateway returned no policy version; nothing to report")
		return loaded, nil
	}
	report := &openshellv1.ReportPolicyStatusRequest{
		SandboxId: cfg.SandboxID,
		Version:   resp.GetVersion(),
		Status:    openshellv1.PolicyStatus_POLICY_STATUS_LOADED,
	}
	if err := enforcement(resp.GetPolicy(), confErr, netErr); err != nil {
		// A report, not a stop: the sandbox keeps running and the
		// revision says truthfully what is not enforced.
		report.Status, report.LoadError = openshellv1.PolicyStatus_POLICY_STATUS_FAILED, err.Error()
		log.Warn("policy is not fully enforced; reporting FAILED", "policy_version", resp.GetVersion(), "reason", report.LoadError)
	}
	b := newBackoff(200*time.Millisecond, 5*time.Second)
	return loaded, gatewayCall(ctx, log, b, cfg.StartupTimeout, "ReportPolicyStatus", func() error {
		_, err := client.ReportPolicyStatus(ctx, report)
		return err
	})
}
