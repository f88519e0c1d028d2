package api

import (
	"testing"

	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	policyrules "github.com/openshell-go/openshell/internal/policy"
)

// TestProvidersV2Composition: with providers_v2_enabled the policy a
// sandbox's supervisor gets carries a _provider_<name> rule per attached
// provider, with the endpoints of its profile the egress proxy enforces
// (github's GraphQL endpoint, path-bound, is left out) and its binaries,
// and a policy hash of its own; the sandbox's own rules stay; without the
// setting, or after a detach, the stored policy is delivered as it is.
func TestProvidersV2Composition(t *testing.T) {
	env := apitest.NewEnv(t)
	s := New(Options{Engine: env.Engine, Store: env.Store, Providers: env.Providers})
	t.Cleanup(s.Close)
	ctx := apitest.As(t.Context(), apitest.LocalDev)
	if _, err := s.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "my.gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "t"}}}); err != nil {
		t.Fatal(err)
	}
	own := &sandboxv1.SandboxPolicy{Version: 1, NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"_provider_my_gh": {Name: "_provider_my_gh", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "own.test", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/curl"}}},
	}}
	sb, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "sb", Spec: &openshellv1.SandboxSpec{Providers: []string{"my.gh"}, Policy: own}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetSandbox().GetMetadata().GetId()
	config := func() *sandboxv1.GetSandboxConfigResponse {
		t.Helper()
		r, err := s.GetSandboxConfig(apitest.As(t.Context(), apitest.Sandbox(id)), &sandboxv1.GetSandboxConfigRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	setV2 := func(on bool) {
		t.Helper()
		if _, err := s.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "providers_v2_enabled",
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}); err != nil {
			t.Fatal(err)
		}
	}
	off := config()
	if len(off.GetPolicy().GetNetworkPolicies()) != 1 {
		t.Fatalf("without providers_v2_enabled the policy has %d rules, want its own one", len(off.GetPolicy().GetNetworkPolicies()))
	}

	setV2(true)
	on := config()
	rules := on.GetPolicy().GetNetworkPolicies()
	if rules["_provider_my_gh"].GetEndpoints()[0].GetHost() != "own.test" {
		t.Errorf("the sandbox's own rule was replaced: %v", rules["_provider_my_gh"])
	}
	r := rules["_provider_my_gh_2"]
	var hosts []string
	for _, e := range r.GetEndpoints() {
		hosts = append(hosts, e.GetHost()+" "+e.GetProtocol()+" "+e.GetPath())
	}
	if len(hosts) != 2 || hosts[0] != "api.github.com rest " || hosts[1] != "github.com rest " || len(r.GetBinaries()) != 4 || r.GetName() != "_provider_my_gh_2" {
		t.Errorf("composed rule: endpoints %q, %d binaries, name %q", hosts, len(r.GetBinaries()), r.GetName())
	}
	if on.GetPolicyHash() == off.GetPolicyHash() || on.GetPolicyHash() != policyrules.Hash(on.GetPolicy()) || on.GetVersion() != off.GetVersion() {
		t.Errorf("composed policy hash %q (stored %q), version %d (was %d)", on.GetPolicyHash(), off.GetPolicyHash(), on.GetVersion(), off.GetVersion())
	}

	if _, err := s.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "sb", ProviderName: "my.gh"}); err != nil {
		t.Fatal(err)
	}
	if d := config(); len(d.GetPolicy().GetNetworkPolicies()) != 1 || d.GetPolicyHash() != off.GetPolicyHash() {
		t.Errorf("after the detach: %d rules, hash %q (stored %q)", len(d.GetPolicy().GetNetworkPolicies()), d.GetPolicyHash(), off.GetPolicyHash())
	}
}

// TestDeleteWorkspaceKeepsProfiles: as OpenShell, a workspace that still
// holds provider profiles cannot be deleted (a workspace created again
// under its name would inherit them); once they are gone it can.
func TestDeleteWorkspaceKeepsProfiles(t *testing.T) {
	s, _ := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	mustCreateWorkspace(t, s, ctx, "team-a", nil)
	r, err := s.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: "team-a", Profiles: []*openshellv1.ProviderProfileImportItem{{
		Profile: &openshellv1.ProviderProfile{Id: "acme", Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.acme.test", Port: 443}}}}}})
	if err != nil || !r.GetImported() {
		t.Fatalf("import = %v, %v", r, err)
	}
	_, err = s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
	wantErr(t, "DeleteWorkspace with a profile", err, codes.FailedPrecondition, `workspace "team-a" still has 1 provider profile(s); delete them first`)
	if _, err := s.DeleteProviderProfile(ctx, &openshellv1.DeleteProviderProfileRequest{Workspace: "team-a", Id: "acme"}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"}); err != nil || !d.GetDeleted() {
		t.Fatalf("DeleteWorkspace = %v, %v", d, err)
	}
}
