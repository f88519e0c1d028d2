package policy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// CheckMergeOperations checks the shape of UpdateConfig merge operations
// with OpenShell's texts (InvalidArgument): every operation set, add_rule
// with a rule name and at least one endpoint, remove_endpoint with host
// and port, remove_rule with a name, add_deny_rules / add_allow_rules with
// host, port and rules, remove_binary with rule name and binary path.
func CheckMergeOperations(ops []*openshellv1.PolicyMergeOperation) error {
	for i, op := range ops {
		var problem string
		switch o := op.GetOperation().(type) {
		case *openshellv1.PolicyMergeOperation_AddRule:
			switch {
			case strings.TrimSpace(o.AddRule.GetRuleName()) == "":
				problem = "add_rule.rule_name is required"
			case len(o.AddRule.GetRule().GetEndpoints()) == 0:
				problem = "add_rule.rule must contain at least one endpoint"
			}
		case *openshellv1.PolicyMergeOperation_RemoveEndpoint:
			if strings.TrimSpace(o.RemoveEndpoint.GetHost()) == "" || o.RemoveEndpoint.GetPort() == 0 {
				problem = "remove_endpoint requires host and non-zero port"
			}
		case *openshellv1.PolicyMergeOperation_RemoveRule:
			if strings.TrimSpace(o.RemoveRule.GetRuleName()) == "" {
				problem = "remove_rule.rule_name is required"
			}
		case *openshellv1.PolicyMergeOperation_AddDenyRules:
			if strings.TrimSpace(o.AddDenyRules.GetHost()) == "" || o.AddDenyRules.GetPort() == 0 || len(o.AddDenyRules.GetDenyRules()) == 0 {
				problem = "add_deny_rules requires host, non-zero port, and at least one deny rule"
			}
		case *openshellv1.PolicyMergeOperation_AddAllowRules:
			if strings.TrimSpace(o.AddAllowRules.GetHost()) == "" || o.AddAllowRules.GetPort() == 0 || len(o.AddAllowRules.GetRules()) == 0 {
				problem = "add_allow_rules requires host, non-zero port, and at least one rule"
			}
		case *openshellv1.PolicyMergeOperation_RemoveBinary:
			if strings.TrimSpace(o.RemoveBinary.GetRuleName()) == "" || strings.TrimSpace(o.RemoveBinary.GetBinaryPath()) == "" {
				problem = "remove_binary requires rule_name and binary_path"
			}
		default:
			return errdefs.InvalidArgument(fmt.Sprintf("merge_operations[%d] is missing an operation", i))
		}
		if problem != "" {
			return errdefs.InvalidArgument(fmt.Sprintf("merge_operations[%d].%s", i, problem))
		}
	}
	return nil
}

// Merge applies ops to a copy of p in order and returns it; p is not
// changed. Either every operation applies or none does. Operations that
// contradict the policy (an endpoint that is not there, a rule widening
// that would grant authorization the operation did not declare) are
// FailedPrecondition with OpenShell's texts. The shape is checked first
// (CheckMergeOperations).
//
// add_rule adds the rule under its name. When a rule of that name exists,
// the two are merged only if no binary gains an endpoint it did not have
// that the operation did not declare for it: a rule grants each of its
// binaries each of its endpoints, so a new binary would inherit the
// existing endpoints and existing binaries the new ones. Unlike OpenShell,
// a rule of a new name is never folded into another rule sharing its
// endpoint; it is kept under its own name (what OpenShell does when the
// fold would widen authorization), which grants exactly what it declares.
func Merge(p *sandboxv1.SandboxPolicy, ops []*openshellv1.PolicyMergeOperation) (*sandboxv1.SandboxPolicy, error) {
	if err := CheckMergeOperations(ops); err != nil {
		return nil, err
	}
	out := &sandboxv1.SandboxPolicy{}
	if p != nil {
		out = proto.Clone(p).(*sandboxv1.SandboxPolicy)
	}
	if out.NetworkPolicies == nil {
		out.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{}
	}
	for i, op := range ops {
		if err := applyOp(out, i, op); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func conflict(format string, a ...any) error {
	return errdefs.FailedPrecondition(fmt.Sprintf(format, a...))
}

func applyOp(p *sandboxv1.SandboxPolicy, i int, op *openshellv1.PolicyMergeOperation) error {
	switch o := op.GetOperation().(type) {
	case *openshellv1.PolicyMergeOperation_AddRule:
		return addRule(p, i, strings.TrimSpace(o.AddRule.GetRuleName()), o.AddRule.GetRule())
	case *openshellv1.PolicyMergeOperation_RemoveEndpoint:
		removeEndpoint(p, strings.TrimSpace(o.RemoveEndpoint.GetRuleName()), strings.TrimSpace(o.RemoveEndpoint.GetHost()), o.RemoveEndpoint.GetPort())
	case *openshellv1.PolicyMergeOperation_RemoveRule:
		delete(p.NetworkPolicies, strings.TrimSpace(o.RemoveRule.GetRuleName()))
	case *openshellv1.PolicyMergeOperation_AddDenyRules:
		host, port := strings.TrimSpace(o.AddDenyRules.GetHost()), o.AddDenyRules.GetPort()
		ep, err := l7Endpoint(p, host, port)
		if err != nil {
			return err
		}
		if ep.GetAccess() == "" && len(ep.GetRules()) == 0 {
			return conflict("endpoint %s:%d has no base allow set; configure access or explicit allow rules before adding deny rules", host, port)
		}
		for _, r := range o.AddDenyRules.GetDenyRules() {
			if !slices.ContainsFunc(ep.DenyRules, func(x *sandboxv1.L7DenyRule) bool { return proto.Equal(x, r) }) {
				ep.DenyRules = append(ep.DenyRules, proto.Clone(r).(*sandboxv1.L7DenyRule))
			}
		}
	case *openshellv1.PolicyMergeOperation_AddAllowRules:
		host, port := strings.TrimSpace(o.AddAllowRules.GetHost()), o.AddAllowRules.GetPort()
		ep, err := l7Endpoint(p, host, port)
		if err != nil {
			return err
		}
		if err := expandAccess(ep, host, port); err != nil {
			return err
		}
		for _, r := range o.AddAllowRules.GetRules() {
			if !slices.ContainsFunc(ep.Rules, func(x *sandboxv1.L7Rule) bool { return proto.Equal(x, r) }) {
				ep.Rules = append(ep.Rules, proto.Clone(r).(*sandboxv1.L7Rule))
			}
		}
	case *openshellv1.PolicyMergeOperation_RemoveBinary:
		return removeBinary(p, i, strings.TrimSpace(o.RemoveBinary.GetRuleName()), strings.TrimSpace(o.RemoveBinary.GetBinaryPath()))
	}
	return nil
}

// RemoveBinary returns p without binary in rule ruleName (the rule is
// removed with its last binary); a rule that authorizes any binary is
// FailedPrecondition, as OpenShell. p is not changed.
func RemoveBinary(p *sandboxv1.SandboxPolicy, ruleName, binary string) (*sandboxv1.SandboxPolicy, error) {
	return Merge(p, []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveBinary{
		RemoveBinary: &openshellv1.RemoveNetworkBinary{RuleName: ruleName, BinaryPath: binary},
	}}})
}

// AddRule returns p with rule added under ruleName (see Merge).
func AddRule(p *sandboxv1.SandboxPolicy, ruleName string, rule *sandboxv1.NetworkPolicyRule) (*sandboxv1.SandboxPolicy, error) {
	return Merge(p, []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddRule{
		AddRule: &openshellv1.AddNetworkRule{RuleName: ruleName, Rule: rule},
	}}})
}

func removeBinary(p *sandboxv1.SandboxPolicy, i int, ruleName, binary string) error {
	rule, ok := p.NetworkPolicies[ruleName]
	if !ok {
		return nil
	}
	if len(rule.GetBinaries()) == 0 {
		return conflict("merge operation %d cannot remove binary '%s' from rule '%s' because the rule authorizes any binary; replace the policy with an explicit binary list or remove the rule", i, binary, ruleName)
	}
	n := len(rule.Binaries)
	rule.Binaries = slices.DeleteFunc(rule.Binaries, func(b *sandboxv1.NetworkBinary) bool { return b.GetPath() == binary })
	if n != len(rule.Binaries) && len(rule.Binaries) == 0 {
		// An empty list would authorize every binary.
		delete(p.NetworkPolicies, ruleName)
	}
	return nil
}

// endpointPorts is the ports an endpoint covers.
func endpointPorts(ep *sandboxv1.NetworkEndpoint) []uint32 {
	if len(ep.GetPorts()) > 0 {
		ps := slices.Clone(ep.GetPorts())
		slices.Sort(ps)
		return slices.Compact(ps)
	}
	return []uint32{ep.GetPort()}
}

func endpointMatches(ep *sandboxv1.NetworkEndpoint, host string, port uint32) bool {
	return strings.EqualFold(ep.GetHost(), host) && slices.Contains(endpointPorts(ep), port)
}

// removeEndpoint drops port from the endpoints at host (in ruleName, or
// in every rule when it is empty); endpoints and rules left empty go.
func removeEndpoint(p *sandboxv1.SandboxPolicy, ruleName, host string, port uint32) {
	for name, rule := range p.NetworkPolicies {
		if ruleName != "" && name != ruleName {
			continue
		}
		rule.Endpoints = slices.DeleteFunc(rule.Endpoints, func(ep *sandboxv1.NetworkEndpoint) bool {
			if !endpointMatches(ep, host, port) {
				return false
			}
			rest := slices.DeleteFunc(endpointPorts(ep), func(x uint32) bool { return x == port })
			if len(rest) == 0 {
				return true
			}
			ep.Port, ep.Ports = rest[0], rest
			return false
		})
		if len(rule.Endpoints) == 0 {
			delete(p.NetworkPolicies, name)
		}
	}
}

// l7Endpoint finds the one endpoint at host:port that add_deny_rules and
// add_allow_rules may change: it must exist, be unambiguous and be
// inspected as rest or websocket.
func l7Endpoint(p *sandboxv1.SandboxPolicy, host string, port uint32) (*sandboxv1.NetworkEndpoint, error) {
	var found []*sandboxv1.NetworkEndpoint
	var targets []string
	for name, rule := range p.NetworkPolicies {
		for _, ep := range rule.GetEndpoints() {
			if endpointMatches(ep, host, port) {
				found = append(found, ep)
				t := name
				if ep.GetPath() != "" {
					t += fmt.Sprintf(" (path '%s')", ep.GetPath())
				}
				targets = append(targets, t)
			}
		}
	}
	switch {
	case len(found) == 0:
		return nil, conflict("endpoint %s:%d was not found in the current policy", host, port)
	case len(found) > 1:
		sort.Strings(targets)
		return nil, conflict("endpoint %s:%d resolves to %s; this operation selects its target by host and port alone, so it cannot say which binary scope and L7 surface to widen. Replace the policy with the full YAML instead", host, port, strings.Join(targets, ", "))
	}
	ep := found[0]
	switch ep.GetProtocol() {
	case "":
		return nil, conflict("endpoint %s:%d has no L7 inspection configured (protocol is empty)", host, port)
	case "rest", "websocket":
		return ep, nil
	default:
		return nil, conflict("endpoint %s:%d uses unsupported protocol '%s'; this operation currently supports only protocol 'rest' or 'websocket'", host, port, ep.GetProtocol())
	}
}

// expandAccess turns an access preset into the explicit rules it stands
// for, so that rules can be added next to them.
func expandAccess(ep *sandboxv1.NetworkEndpoint, host string, port uint32) error {
	if ep.GetAccess() == "" {
		return nil
	}
	var methods []string
	switch ep.GetAccess() {
	case "full":
		methods = []string{"*"}
	case "read-only":
		methods = []string{"GET", "HEAD", "OPTIONS"}
		if ep.GetProtocol() == "websocket" {
			methods = []string{"GET"}
		}
	case "read-write":
		methods = []string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"}
		if ep.GetProtocol() == "websocket" {
			methods = []string{"GET", "WEBSOCKET_TEXT"}
		}
	default:
		return errdefs.InvalidArgument(fmt.Sprintf("endpoint %s:%d uses unsupported access preset '%s'", host, port, ep.GetAccess()))
	}
	for _, m := range methods {
		ep.Rules = append(ep.Rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: m, Path: "**"}})
	}
	ep.Access = ""
	return nil
}

// anyBinaryScope names a rule without binaries in error texts.
const anyBinaryScope = "any binary"

func addRule(p *sandboxv1.SandboxPolicy, i int, name string, in *sandboxv1.NetworkPolicyRule) error {
	in = proto.Clone(in).(*sandboxv1.NetworkPolicyRule)
	if in.Name == "" {
		in.Name = name
	}
	cur, ok := p.NetworkPolicies[name]
	if !ok {
		p.NetworkPolicies[name] = in
		return nil
	}
	hasEndpoint := func(eps []*sandboxv1.NetworkEndpoint, ep *sandboxv1.NetworkEndpoint) bool {
		return slices.ContainsFunc(eps, func(x *sandboxv1.NetworkEndpoint) bool { return proto.Equal(x, ep) })
	}
	hasBinary := func(bs []*sandboxv1.NetworkBinary, path string) bool {
		return slices.ContainsFunc(bs, func(b *sandboxv1.NetworkBinary) bool { return b.GetPath() == path })
	}
	// Binaries the rule gains, and endpoints it already grants that the
	// operation did not declare: the former would inherit the latter.
	var newBinaries []string
	switch {
	case len(cur.GetBinaries()) == 0: // any binary already
	case len(in.GetBinaries()) == 0:
		newBinaries = []string{anyBinaryScope}
	default:
		for _, b := range in.GetBinaries() {
			if !hasBinary(cur.GetBinaries(), b.GetPath()) {
				newBinaries = append(newBinaries, b.GetPath())
			}
		}
	}
	if len(newBinaries) > 0 {
		for _, ep := range cur.GetEndpoints() {
			if !hasEndpoint(in.GetEndpoints(), ep) {
				return conflict("merge operation %d add-rule '%s' would grant %s undeclared authorization for %s on ports %s", i, name, newBinaries[0], ep.GetHost(), portList(endpointPorts(ep)))
			}
		}
	}
	// Endpoints the rule gains, and binaries it already has that the
	// operation did not declare: the latter would gain the former.
	var undeclared []string
	switch {
	case len(in.GetBinaries()) == 0: // declares any binary
	case len(cur.GetBinaries()) == 0:
		undeclared = []string{"the existing any-binary scope"}
	default:
		for _, b := range cur.GetBinaries() {
			if !hasBinary(in.GetBinaries(), b.GetPath()) {
				undeclared = append(undeclared, fmt.Sprintf("binary '%s'", b.GetPath()))
			}
		}
	}
	for _, ep := range in.GetEndpoints() {
		if hasEndpoint(cur.GetEndpoints(), ep) {
			continue
		}
		if len(undeclared) > 0 {
			return conflict("merge operation %d add-rule '%s' would grant existing binaries new or changed authorization for %s on ports %s; also declare %s", i, name, ep.GetHost(), portList(endpointPorts(ep)), strings.Join(undeclared, ", "))
		}
		cur.Endpoints = append(cur.Endpoints, ep)
	}
	if len(in.GetBinaries()) == 0 {
		cur.Binaries = nil
	}
	for _, b := range in.GetBinaries() {
		if len(cur.GetBinaries()) > 0 && !hasBinary(cur.GetBinaries(), b.GetPath()) {
			cur.Binaries = append(cur.Binaries, b)
		}
	}
	return nil
}

// portList renders ports as OpenShell does ([80, 443]).
func portList(ps []uint32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// Covers reports whether p already grants everything rule asks for (as
// OpenShell's policy_covers_rule): for every endpoint, port and binary of
// rule (every binary when it names none), some rule of p whose binaries
// include it (or that allows any binary) has an endpoint at that host,
// path and port whose L7 rules, deny rules and allowed_ips contain the
// proposed ones and whose protocol and access match where the proposal
// sets them; any other field the proposal sets must be equal.
func Covers(p *sandboxv1.SandboxPolicy, rule *sandboxv1.NetworkPolicyRule) bool {
	if len(rule.GetEndpoints()) == 0 {
		return false
	}
	for _, want := range rule.GetEndpoints() {
		for _, port := range endpointPorts(want) {
			covered := func(bin string) bool {
				for _, r := range p.GetNetworkPolicies() {
					scope := len(r.GetBinaries()) == 0 || (bin != "" && slices.ContainsFunc(r.GetBinaries(), func(b *sandboxv1.NetworkBinary) bool { return b.GetPath() == bin }))
					if scope && slices.ContainsFunc(r.GetEndpoints(), func(have *sandboxv1.NetworkEndpoint) bool { return endpointCovers(have, want, port) }) {
						return true
					}
				}
				return false
			}
			if len(rule.GetBinaries()) == 0 && !covered("") {
				return false
			}
			for _, b := range rule.GetBinaries() {
				if !covered(b.GetPath()) {
					return false
				}
			}
		}
	}
	return true
}

func endpointCovers(have, want *sandboxv1.NetworkEndpoint, port uint32) bool {
	if !strings.EqualFold(have.GetHost(), want.GetHost()) || have.GetPath() != want.GetPath() || !slices.Contains(endpointPorts(have), port) {
		return false
	}
	if (want.GetProtocol() != "" && want.GetProtocol() != have.GetProtocol()) || (want.GetAccess() != "" && want.GetAccess() != have.GetAccess()) {
		return false
	}
	containsAll := func(have, want []proto.Message) bool {
		return !slices.ContainsFunc(want, func(w proto.Message) bool {
			return !slices.ContainsFunc(have, func(h proto.Message) bool { return proto.Equal(h, w) })
		})
	}
	if !containsAll(messages(have.GetRules()), messages(want.GetRules())) || !containsAll(messages(have.GetDenyRules()), messages(want.GetDenyRules())) {
		return false
	}
	for _, ip := range want.GetAllowedIps() {
		if !slices.Contains(have.GetAllowedIps(), ip) {
			return false
		}
	}
	rest := func(e *sandboxv1.NetworkEndpoint) *sandboxv1.NetworkEndpoint {
		c := proto.Clone(e).(*sandboxv1.NetworkEndpoint)
		c.Host, c.Port, c.Ports, c.Path, c.Protocol, c.Access, c.Rules, c.DenyRules, c.AllowedIps = "", 0, nil, "", "", "", nil, nil, nil
		return c
	}
	w := rest(want)
	return proto.Equal(w, &sandboxv1.NetworkEndpoint{}) || proto.Equal(w, rest(have))
}

func messages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}
