package api

import (
	"strings"
	"testing"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/credentials"
	domainproviders "github.com/openshell-go/openshell/internal/providers"
)

// TestAdvisorSeesProviderCredentials: a sandbox with a GitHub provider
// attached holds a credential for the GitHub profile's hosts, so a denial
// proposing curl's reach to api.github.com is flagged
// credential_reach_expansion and never auto-approved, while the same
// proposal for a host no credential is for has no finding.
func TestAdvisorSeesProviderCredentials(t *testing.T) {
	env := apitest.NewEnv(t)
	kr, err := credentials.LoadOrCreateKEK(t.TempDir() + "/kek")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Engine: env.Engine, Store: env.Store, Providers: domainproviders.NewStore(domainproviders.Options{Objects: env.Store, Keyring: kr})})
	t.Cleanup(s.Close)
	ctx := as(t.Context(), localDev)
	if _, err := s.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "t"},
	}}); err != nil {
		t.Fatal(err)
	}
	sb, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "adv", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh"}, Policy: &sandboxv1.SandboxPolicy{Version: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	sup := as(t.Context(), apitest.Sandbox(sb.GetSandbox().GetMetadata().GetId()))
	if _, err := s.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "adv", SettingKey: "proposal_approval_mode", SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: "auto"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SubmitPolicyAnalysis(sup, &openshellv1.SubmitPolicyAnalysisRequest{Name: "adv", Summaries: []*openshellv1.DenialSummary{
		{Binary: "/usr/bin/curl", Host: "api.github.com", Port: 443, Count: 1},
		{Binary: "/usr/bin/curl", Host: "example.com", Port: 443, Count: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: "adv"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*openshellv1.PolicyChunk{}
	for _, c := range r.GetChunks() {
		got[c.GetRuleName()] = c
	}
	if c := got["allow_api_github_com_443"]; c.GetStatus() != "pending" || !strings.Contains(c.GetValidationResult(), "credential_reach_expansion: api.github.com:443 via /usr/bin/curl") {
		t.Errorf("github chunk = %v %q, want pending with credential_reach_expansion", c.GetStatus(), c.GetValidationResult())
	}
	if c := got["allow_example_com_443"]; c.GetStatus() != "approved" || c.GetValidationResult() != "prover: no new findings" {
		t.Errorf("example.com chunk = %v %q, want auto-approved without findings", c.GetStatus(), c.GetValidationResult())
	}
}
