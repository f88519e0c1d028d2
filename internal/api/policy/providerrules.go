package policy

import (
	"context"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	policyrules "github.com/openshell-go/openshell/internal/policy"
)

// providersV2 is the setting that makes provider profiles contribute
// network rules.
const providersV2 = "providers_v2_enabled"

// composeProviderRules adds, as OpenShell does when providers_v2_enabled
// is true and the policy is the sandbox's own (not global), the network
// rules of the sandbox's provider profiles (Options.ProviderRules) to the
// policy resp delivers; the delivered policy_hash is then the composed
// policy's, so supervisors reload when the composition changes.
func (s *Service) composeProviderRules(ctx context.Context, sb *openshellv1.Sandbox, resp *sandboxv1.GetSandboxConfigResponse) error {
	if s.o.ProviderRules == nil || resp.GetPolicy() == nil || resp.GetPolicySource() == sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL ||
		!resp.GetSettings()[providersV2].GetValue().GetBoolValue() {
		return nil
	}
	policy, err := s.o.ProviderRules(ctx, sb, resp.GetPolicy())
	if err != nil || policy == resp.GetPolicy() {
		return err
	}
	resp.Policy, resp.PolicyHash = policy, policyrules.Hash(policy)
	return nil
}
