package supervisor

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// enforcement is the one place that decides whether this supervisor
// enforces a policy. It returns nil when every section present in p is
// enforced, so the revision may be reported LOADED; otherwise an error
// naming each section that is not enforced and why, which is reported as
// the revision's FAILED load_error. A section that is absent or empty asks
// for nothing and is never a reason to fail.
//
// The filesystem, landlock and process sections are enforced by the agent
// confinement (internal/supervisor/isolation): confErr is the error of
// building it for p (an identity the supervisor cannot switch to, a
// Landlock hard_requirement it cannot meet), and then no agent process
// starts. network_policies are enforced by the egress proxy
// (internal/supervisor/egress): netErr is the error of installing them,
// nil only when the proxy runs and enforces every rule as written. The
// proxy does not run without a network namespace and host dialer of the
// sandbox's own, or in a pod (fence mode) an nftables fence; a fence that
// cannot be installed (errAgentNetworkOpen) is reported whatever the
// policy's network rules, since without it not even an empty
// network_policies (no egress at all) holds. protocol rest endpoints are enforced for plain http://
// requests and inside CONNECT tunnels (TLS terminated with the sandbox
// CA; with tls skip the tunnels are relayed uninspected, as in OpenShell,
// and the policy still counts as enforced); other L7 protocols are not
// implemented and their endpoints are denied. network_middlewares are run by nothing. See docs/security.md.
func enforcement(p *sandboxv1.SandboxPolicy, confErr, netErr error) error {
	var errs []error
	if confErr != nil {
		errs = append(errs, fmt.Errorf("agent confinement failed, no agent process starts: %w", confErr))
	}
	switch n := p.GetNetworkPolicies(); {
	case netErr == nil:
	case len(n) > 0:
		errs = append(errs, fmt.Errorf("network policies are not enforced as written: %w (rules: %s)",
			netErr, strings.Join(slices.Sorted(maps.Keys(n)), ", ")))
	case errors.Is(netErr, errAgentNetworkOpen):
		errs = append(errs, fmt.Errorf("the policy allows no egress, but this is not enforced: %w", netErr))
	}
	if m := p.GetNetworkMiddlewares(); len(m) > 0 {
		errs = append(errs, fmt.Errorf("network middlewares are not enforced by this supervisor: the egress proxy runs no middlewares (middlewares: %s)",
			strings.Join(slices.Sorted(maps.Keys(m)), ", ")))
	}
	return joinErrs(errs)
}

// joinErrs joins errs into one error whose text is the messages separated
// by "; " (errors.Join uses newlines, which read badly in a status).
func joinErrs(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}
