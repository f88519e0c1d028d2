package supervisor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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

// bootstrapConfig fetches the sandbox configuration, seeding the default
// policy when the gateway has none, builds the agent confinement from the
// policy and installs its network rules in the egress proxy with prepare,
// and reports the policy's status: LOADED when
// enforcement accepts every section, FAILED with the reason otherwise. A
// policy that cannot be enforced is not a startup failure: the revision
// says so, and when the confinement itself failed every agent spawn fails
// closed. Transient failures are retried with backoff until
// cfg.StartupTimeout.
func bootstrapConfig(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, cfg Config, prepare func(*sandboxv1.SandboxPolicy) (confErr, netErr error)) (loadedPolicy, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()
	b := newBackoff(200*time.Millisecond, 5*time.Second)
	call := func(name string, f func() error) error {
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
				return fmt.Errorf("%s: no success within %s: %w", name, cfg.StartupTimeout, err)
			}
		}
	}
	var resp *sandboxv1.GetSandboxConfigResponse
	fetch := func() error {
		var err error
		resp, err = client.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: cfg.SandboxID})
		return err
	}
	if err := call("GetSandboxConfig", fetch); err != nil {
		return loadedPolicy{}, err
	}
	if resp.GetPolicy() == nil {
		log.Info("gateway has no policy for this sandbox; syncing the default policy")
		if err := call("UpdateConfig", func() error {
			_, err := client.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: cfg.SandboxName, Policy: defaultPolicy()})
			return err
		}); err != nil {
			return loadedPolicy{}, err
		}
		b.reset()
		if err := call("GetSandboxConfig", fetch); err != nil {
			return loadedPolicy{}, err
		}
	}
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
	return loaded, call("ReportPolicyStatus", func() error {
		_, err := client.ReportPolicyStatus(ctx, report)
		return err
	})
}
