package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress/placeholder"
)

// providerEnvRefresh is how often the supervisor asks the gateway whether
// the provider environment changed.
const providerEnvRefresh = 30 * time.Second

// providerEnv holds the provider environment the gateway hands this
// sandbox. As OpenShell's supervisor, it asks for credential values with
// their endpoint bindings (supports_static_credential_bindings), keeps the
// values in memory only, in creds (the egress proxy's placeholder
// resolver), and gives agent processes only placeholders. Agent processes
// started after a change see the new environment; running processes keep
// theirs, and their placeholders resolve to the current values (a detached
// credential stops resolving). It is safe for concurrent use.
type providerEnv struct {
	creds *placeholder.Resolver

	mu   sync.Mutex
	vars map[string]string
	rev  uint64
}

func newProviderEnv() *providerEnv { return &providerEnv{creds: &placeholder.Resolver{}} }

// fetch reads the provider environment once and installs it. It reports
// whether the revision changed. A response it cannot use (a credential
// without endpoints, an invalid key) is an error and the previous
// environment stays; errors never carry a value.
func (p *providerEnv) fetch(ctx context.Context, client openshellv1.OpenShellClient, sandboxID string) (bool, error) {
	resp, err := client.GetSandboxProviderEnvironment(ctx, &openshellv1.GetSandboxProviderEnvironmentRequest{
		SandboxId: sandboxID, SupportsStaticCredentialBindings: true,
	})
	if err != nil {
		return false, err
	}
	vars := map[string]string{}
	plain := map[string]bool{}
	for _, k := range resp.GetNonSecretEnvironmentKeys() {
		plain[k] = true
	}
	var creds []placeholder.Credential
	for key, value := range resp.GetEnvironment() {
		if plain[key] {
			vars[key] = value
			continue
		}
		c := placeholder.Credential{Key: key, Value: value, ExpiresAtMs: resp.GetCredentialExpiresAtMs()[key]}
		for _, e := range resp.GetStaticCredentialBindings()[key].GetEndpoints() {
			c.Endpoints = append(c.Endpoints, placeholder.Endpoint{Host: e.GetHost(), Port: e.GetPort(), Path: e.GetPath()})
		}
		creds = append(creds, c)
		vars[key] = placeholder.For(key)
	}
	set, err := placeholder.NewSet(creds)
	if err != nil {
		return false, fmt.Errorf("provider environment revision %d: %w", resp.GetProviderEnvRevision(), err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := resp.GetProviderEnvRevision() != p.rev || len(vars) != len(p.vars)
	p.creds.Install(set)
	p.vars, p.rev = vars, resp.GetProviderEnvRevision()
	return changed, nil
}

// list returns the provider variables as sorted KEY=VALUE entries.
func (p *providerEnv) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.vars))
	for k, v := range p.vars {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// overlay returns base without the entries whose names extra sets,
// followed by extra: extra wins.
func overlay(base, extra []string) []string {
	set := make(map[string]bool, len(extra))
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// refreshLoop re-reads the provider environment every interval until ctx
// ends. Failures are logged and retried at the next tick: the last
// environment stays in force.
func (p *providerEnv) refreshLoop(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, sandboxID string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := p.fetch(ctx, client, sandboxID)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("provider environment refresh failed", "err", err)
		case changed:
			p.mu.Lock()
			rev, n := p.rev, len(p.vars)
			p.mu.Unlock()
			log.Info("provider environment changed", "revision", rev, "variables", n)
		}
	}
}
