package providers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ProviderRulePrefix starts the keys of the network rules composed from
// provider profiles (providers_v2_enabled), as OpenShell's.
const ProviderRulePrefix = "_provider_"

// ProviderRuleName is the rule key of provider name: lower case, every
// character but letters, digits and '_' replaced by '_', as OpenShell's.
func ProviderRuleName(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			b[i] = '_'
		}
	}
	s := strings.Trim(string(b), "_")
	if s == "" {
		s = "unnamed"
	}
	return ProviderRulePrefix + s
}

// composable reports whether the sandbox's egress proxy enforces an
// endpoint as written: no path, protocol rest or none, tls terminate or
// passthrough, no credential signing or binding, no uninspected
// credentials, no GraphQL, JSON-RPC or MCP options. Other profile
// endpoints are left out of composed rules (fail closed).
func composable(e *sandboxv1.NetworkEndpoint) bool {
	switch strings.ToLower(e.GetProtocol()) {
	case "", "tcp", "rest":
	default:
		return false
	}
	switch e.GetTls() {
	case "", "terminate", "passthrough":
	default:
		return false
	}
	return e.GetPath() == "" && e.GetCredentialSigning() == "" && e.GetCredentialBinding() == nil && !e.GetAllowUninspectedCredentials() &&
		!e.GetWebsocketCredentialRewrite() && e.GetPersistedQueries() == "" && len(e.GetGraphqlPersistedQueries()) == 0 &&
		e.GetGraphqlMaxBodyBytes() == 0 && e.GetJsonRpcMaxBodyBytes() == 0 && e.GetMcp() == nil
}

// ProfileRules returns the network rules the profiles of sb's attached
// providers contribute: per provider whose profile has endpoints the
// egress proxy enforces, a rule keyed ProviderRuleName with those
// endpoints and the profile's binaries. Providers gone meanwhile and
// profiles without such endpoints contribute nothing.
func (s *Store) ProfileRules(ctx context.Context, sb *openshellv1.Sandbox) (map[string]*sandboxv1.NetworkPolicyRule, error) {
	ctx, err := s.CaptureProfiles(ctx) // one catalog for every provider
	if err != nil {
		return nil, err
	}
	rules := map[string]*sandboxv1.NetworkPolicyRule{}
	for _, name := range sb.GetSpec().GetProviders() {
		p, err := s.Get(ctx, sb.GetMetadata().GetWorkspace(), name)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		prof, ok, err := s.ProfileOf(ctx, p)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		rule := &sandboxv1.NetworkPolicyRule{}
		for _, e := range prof.GetEndpoints() {
			if composable(e) {
				rule.Endpoints = append(rule.Endpoints, proto.Clone(e).(*sandboxv1.NetworkEndpoint))
			}
		}
		if len(rule.Endpoints) == 0 {
			continue
		}
		for _, b := range prof.GetBinaries() {
			rule.Binaries = append(rule.Binaries, proto.Clone(b).(*sandboxv1.NetworkBinary))
		}
		key := ProviderRuleName(name)
		for i := 2; rules[key] != nil; i++ {
			key = fmt.Sprintf("%s_%d", ProviderRuleName(name), i)
		}
		rule.Name = key
		rules[key] = rule
	}
	return rules, nil
}

// ComposePolicy returns a copy of policy with rules added under keys the
// policy does not use yet (a numeric suffix when taken), as OpenShell
// composes provider layers: the policy's own rules are never replaced.
func ComposePolicy(policy *sandboxv1.SandboxPolicy, rules map[string]*sandboxv1.NetworkPolicyRule) *sandboxv1.SandboxPolicy {
	out := proto.Clone(policy).(*sandboxv1.SandboxPolicy)
	if out.NetworkPolicies == nil {
		out.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{}
	}
	for _, k := range slices.Sorted(maps.Keys(rules)) {
		key := k
		for i := 2; out.NetworkPolicies[key] != nil; i++ {
			key = fmt.Sprintf("%s_%d", k, i)
		}
		r := proto.Clone(rules[k]).(*sandboxv1.NetworkPolicyRule)
		r.Name = key
		out.NetworkPolicies[key] = r
	}
	return out
}
