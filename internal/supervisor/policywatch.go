package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// loadedPolicy is the policy version the supervisor last acted on.
type loadedPolicy struct {
	version uint32
	hash    string
	policy  *sandboxv1.SandboxPolicy // as first loaded: its static sections are in force
	confErr error                    // of building the agent confinement at start
	// settings are the effective settings the first config carried.
	settings map[string]*sandboxv1.EffectiveSetting
}

// policyPollInterval is how often the supervisor asks for a new policy
// version; UpdateConfig takes effect within about this long.
const policyPollInterval = time.Second

// watchPolicy polls GetSandboxConfig and applies each new policy version:
// its network rules go to the egress proxy with reload (which keeps the
// previous rules when the new ones are not enforced as written), and the
// version is reported LOADED or FAILED with the reason. Static sections
// (filesystem, landlock, process) apply at start only: a version that
// changes them is reported FAILED and nothing of it is applied. Every
// poll's effective settings go to settings.
func watchPolicy(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, sandboxID string, cur loadedPolicy, interval time.Duration, reload func(*sandboxv1.SandboxPolicy) error, settings func(map[string]*sandboxv1.EffectiveSetting)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		resp, err := client.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: sandboxID})
		if err != nil {
			log.Debug("policy poll failed", "err", err)
			continue
		}
		settings(resp.GetSettings())
		if resp.GetVersion() == 0 || resp.GetPolicy() == nil || (resp.GetVersion() == cur.version && resp.GetPolicyHash() == cur.hash) {
			continue
		}
		p := resp.GetPolicy()
		var loadErr error
		if !sameStatic(cur.policy, p) {
			loadErr = errors.New("filesystem, landlock and process sections apply at sandbox start only; the new version is not applied")
		} else {
			loadErr = enforcement(p, cur.confErr, reload(p))
		}
		report := &openshellv1.ReportPolicyStatusRequest{SandboxId: sandboxID, Version: resp.GetVersion(), Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED}
		if err := loadErr; err != nil {
			report.Status, report.LoadError = openshellv1.PolicyStatus_POLICY_STATUS_FAILED, err.Error()
			log.Warn("new policy version not loaded; the previous network rules stay in force", "policy_version", resp.GetVersion(), "reason", report.LoadError)
		} else {
			log.Info("policy version loaded", "policy_version", resp.GetVersion(), "policy_hash", resp.GetPolicyHash())
		}
		if _, err := client.ReportPolicyStatus(ctx, report); err != nil {
			log.Warn("cannot report the policy status; retrying at the next poll", "policy_version", resp.GetVersion(), "err", err)
			continue // reload is idempotent: the next poll applies and reports again
		}
		cur.version, cur.hash = resp.GetVersion(), resp.GetPolicyHash()
	}
}

// sameStatic reports whether a and b agree on everything but the network
// sections.
func sameStatic(a, b *sandboxv1.SandboxPolicy) bool {
	strip := func(p *sandboxv1.SandboxPolicy) *sandboxv1.SandboxPolicy {
		c := proto.Clone(p).(*sandboxv1.SandboxPolicy)
		c.NetworkPolicies, c.NetworkMiddlewares, c.Version = nil, nil, 0
		return c
	}
	if a == nil {
		a = &sandboxv1.SandboxPolicy{}
	}
	return proto.Equal(strip(a), strip(b))
}
