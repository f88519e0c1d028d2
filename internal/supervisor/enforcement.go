package supervisor

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// enforcement is the one place that decides whether this supervisor
// enforces a policy. It returns nil when every section present in p is
// enforced, so the revision may be reported LOADED; otherwise an error
// naming each section that is not enforced and why, which is reported as
// the revision's FAILED load_error. A section that is absent or empty asks
// for nothing and is never a reason to fail.
//
// Nothing is enforced yet: the agent runs without Landlock, without a
// change of user and without an egress proxy. Each isolation layer that
// lands removes its section from this function, together with the test
// that proves the enforcement (see docs/supervisor.md, "Policy").
func enforcement(p *sandboxv1.SandboxPolicy) error {
	var errs []error
	if proto.Size(p.GetFilesystem()) > 0 {
		errs = append(errs, errors.New("filesystem policy is not enforced by this supervisor: no Landlock ruleset is applied to the agent"))
	}
	if proto.Size(p.GetLandlock()) > 0 {
		errs = append(errs, errors.New("landlock policy is not enforced by this supervisor: Landlock is not applied"))
	}
	if proto.Size(p.GetProcess()) > 0 {
		errs = append(errs, errors.New("process policy is not enforced by this supervisor: the agent runs as the supervisor's user"))
	}
	if n := p.GetNetworkPolicies(); len(n) > 0 {
		errs = append(errs, fmt.Errorf("network policies are not enforced by this supervisor: there is no egress proxy (rules: %s)",
			strings.Join(slices.Sorted(maps.Keys(n)), ", ")))
	}
	if m := p.GetNetworkMiddlewares(); len(m) > 0 {
		errs = append(errs, fmt.Errorf("network middlewares are not enforced by this supervisor: there is no egress proxy (middlewares: %s)",
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
