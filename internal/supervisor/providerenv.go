package supervisor

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// providerEnvRefresh is how often the supervisor asks the gateway whether
// the provider environment changed.
const providerEnvRefresh = 30 * time.Second

// providerEnv holds the provider environment the gateway hands this
// sandbox: credential keys mapped to placeholders (never values; the
// egress proxy resolves placeholders) and the revision they belong to.
// Agent processes started after a change see the new environment; running
// processes keep theirs. It is safe for concurrent use.
type providerEnv struct {
	mu   sync.Mutex
	vars map[string]string
	rev  uint64
}

// fetch reads the provider environment once. It reports whether the
// revision changed.
func (p *providerEnv) fetch(ctx context.Context, client openshellv1.OpenShellClient, sandboxID string) (bool, error) {
	resp, err := client.GetSandboxProviderEnvironment(ctx, &openshellv1.GetSandboxProviderEnvironmentRequest{SandboxId: sandboxID})
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := resp.GetProviderEnvRevision() != p.rev || len(resp.GetEnvironment()) != len(p.vars)
	p.vars, p.rev = resp.GetEnvironment(), resp.GetProviderEnvRevision()
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
