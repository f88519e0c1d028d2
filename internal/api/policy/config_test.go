package policy_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/policy"
)

func globalPolicy() *sandboxv1.SandboxPolicy {
	p := livePolicy()
	p.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{
		"corp": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "git.corp.example", Port: 443}}},
	}
	return p
}

func boolSetting(b bool) *sandboxv1.SettingValue {
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: b}}
}

func stringSetting(s string) *sandboxv1.SettingValue {
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: s}}
}

func config(t *testing.T, svc *policy.Service, id string) *sandboxv1.GetSandboxConfigResponse {
	t.Helper()
	cfg, err := svc.GetSandboxConfig(apitest.As(t.Context(), apitest.Sandbox(id)), &sandboxv1.GetSandboxConfigRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("GetSandboxConfig: %v", err)
	}
	return cfg
}

// A global policy replaces every sandbox's own policy in GetSandboxConfig
// while it is set, is versioned, blocks sandbox policy updates, and once
// removed the sandbox's own policy is in force again.
func TestGlobalPolicyOverridesAndIsRemoved(t *testing.T) {
	svc, _, id := setup(t)
	root := apitest.As(t.Context(), apitest.OIDCRoot)
	before := config(t, svc, id)
	if before.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX || before.GetGlobalPolicyVersion() != 0 {
		t.Fatalf("before: source %v, global version %d; want SANDBOX, 0", before.GetPolicySource(), before.GetGlobalPolicyVersion())
	}

	bad := globalPolicy()
	bad.Process = &sandboxv1.ProcessPolicy{RunAsUser: "root"}
	_, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, Policy: bad})
	apitest.WantErr(t, "UpdateConfig(global, unsafe)", err, codes.InvalidArgument, "run_as_user must be 'sandbox'")
	if cfg := config(t, svc, id); cfg.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX {
		t.Fatalf("a refused global policy is in force: %v", cfg.GetPolicySource())
	}

	up, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, Policy: globalPolicy()})
	if err != nil || up.GetVersion() != 1 || up.GetPolicyHash() == "" {
		t.Fatalf("UpdateConfig(global policy) = %v, %v; want version 1", up, err)
	}
	cfg := config(t, svc, id)
	if cfg.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL || cfg.GetGlobalPolicyVersion() != 1 ||
		!proto.Equal(cfg.GetPolicy(), globalPolicy()) || cfg.GetPolicyHash() != up.GetPolicyHash() || cfg.GetVersion() != 1 {
		t.Fatalf("with a global policy: %v; want the global policy, source GLOBAL, global version 1, sandbox version 1", cfg)
	}
	if cfg.GetConfigRevision() == before.GetConfigRevision() {
		t.Error("config_revision did not change with the global policy")
	}

	aa := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	more := livePolicy()
	more.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}
	_, err = svc.UpdateConfig(aa, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: more})
	apitest.WantErr(t, "UpdateConfig(sandbox policy under a global one)", err, codes.FailedPrecondition,
		"policy is managed globally; delete global policy before sandbox policy update")

	if again, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, Policy: globalPolicy()}); err != nil || again.GetVersion() != 1 {
		t.Fatalf("UpdateConfig(same global policy) = %v, %v; want version 1 again", again, err)
	}
	second := globalPolicy()
	second.NetworkPolicies["pypi"] = more.NetworkPolicies["pypi"]
	if up, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, Policy: second}); err != nil || up.GetVersion() != 2 {
		t.Fatalf("UpdateConfig(second global policy) = %v, %v; want version 2", up, err)
	}
	if cfg := config(t, svc, id); cfg.GetGlobalPolicyVersion() != 2 || !proto.Equal(cfg.GetPolicy(), second) {
		t.Fatalf("global version %d, want 2 with the second policy", cfg.GetGlobalPolicyVersion())
	}

	_, err = svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", SettingValue: boolSetting(true)})
	apitest.WantErr(t, "UpdateConfig(set policy key)", err, codes.InvalidArgument, "reserved key 'policy' must be set via the policy field")
	del, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", DeleteSetting: true})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("UpdateConfig(delete global policy) = %v, %v; want deleted", del, err)
	}
	after := config(t, svc, id)
	if after.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX || after.GetGlobalPolicyVersion() != 0 ||
		!proto.Equal(after.GetPolicy(), livePolicy()) || after.GetConfigRevision() != before.GetConfigRevision() {
		t.Fatalf("after removal: %v; want the sandbox's own policy and the config revision of before", after)
	}
	if del, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", DeleteSetting: true}); err != nil || del.GetDeleted() {
		t.Fatalf("UpdateConfig(delete again) = %v, %v; want not deleted", del, err)
	}

	list, err := svc.ListSandboxPolicies(root, &openshellv1.ListSandboxPoliciesRequest{Global: true})
	if err != nil {
		t.Fatal(err)
	}
	if revs := list.GetRevisions(); len(revs) != 2 || revs[0].GetVersion() != 2 || revs[0].GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED ||
		revs[1].GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED {
		t.Errorf("global revisions after removal = %v, want 2 and 1, both SUPERSEDED", revs)
	}
	st, err := svc.GetSandboxPolicyStatus(root, &openshellv1.GetSandboxPolicyStatusRequest{Global: true, Version: 1})
	if err != nil || st.GetRevision().GetVersion() != 1 || !proto.Equal(st.GetRevision().GetPolicy(), globalPolicy()) {
		t.Errorf("GetSandboxPolicyStatus(global, 1) = %v, %v", st, err)
	}
	if up, err := svc.UpdateConfig(aa, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: more}); err != nil || up.GetVersion() != 2 {
		t.Fatalf("UpdateConfig(sandbox policy after removal) = %v, %v; want version 2", up, err)
	}
}

// Settings at both scopes: a sandbox value is reported with scope
// SANDBOX, a global value overrides it (GLOBAL) and blocks sandbox writes
// of that key until it is deleted.
func TestSettingsScopes(t *testing.T) {
	svc, _, id := setup(t)
	root := apitest.As(t.Context(), apitest.OIDCRoot)
	aa := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	sandboxReq := func(v *sandboxv1.SettingValue, del bool) *openshellv1.UpdateConfigRequest {
		return &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "proposal_approval_mode", SettingValue: v, DeleteSetting: del}
	}
	globalReq := func(v *sandboxv1.SettingValue, del bool) *openshellv1.UpdateConfigRequest {
		return &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "proposal_approval_mode", SettingValue: v, DeleteSetting: del}
	}
	effective := func() *sandboxv1.EffectiveSetting {
		t.Helper()
		cfg := config(t, svc, id)
		for _, k := range []string{"providers_v2_enabled", "ocsf_json_enabled", "agent_policy_proposals_enabled", "proposal_approval_mode"} {
			if _, ok := cfg.GetSettings()[k]; !ok {
				t.Errorf("GetSandboxConfig lacks registered key %s", k)
			}
		}
		return cfg.GetSettings()["proposal_approval_mode"]
	}
	if e := effective(); e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_UNSPECIFIED || e.GetValue() != nil {
		t.Fatalf("unset: %v, want no value, scope UNSPECIFIED", e)
	}
	rev0 := config(t, svc, id).GetConfigRevision()

	up, err := svc.UpdateConfig(aa, sandboxReq(stringSetting("auto"), false))
	if err != nil || up.GetSettingsRevision() != 1 {
		t.Fatalf("UpdateConfig(sandbox setting) = %v, %v; want settings revision 1", up, err)
	}
	if e := effective(); e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_SANDBOX || e.GetValue().GetStringValue() != "auto" {
		t.Fatalf("sandbox value: %v, want auto from SANDBOX", e)
	}
	if config(t, svc, id).GetConfigRevision() == rev0 {
		t.Error("config_revision did not change with a setting")
	}
	if up, err := svc.UpdateConfig(aa, sandboxReq(stringSetting("auto"), false)); err != nil || up.GetSettingsRevision() != 1 {
		t.Errorf("UpdateConfig(same value) = %v, %v; want settings revision 1 (no new revision)", up, err)
	}

	if up, err := svc.UpdateConfig(root, globalReq(stringSetting("manual"), false)); err != nil || up.GetSettingsRevision() != 1 {
		t.Fatalf("UpdateConfig(global setting) = %v, %v; want settings revision 1", up, err)
	}
	if e := effective(); e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL || e.GetValue().GetStringValue() != "manual" {
		t.Fatalf("global value: %v, want manual from GLOBAL", e)
	}
	gw, err := svc.GetGatewayConfig(aa, &sandboxv1.GetGatewayConfigRequest{})
	if err != nil || gw.GetSettingsRevision() != 1 || gw.GetSettings()["proposal_approval_mode"].GetStringValue() != "manual" ||
		gw.GetSettings()["ocsf_json_enabled"].GetValue() != nil || len(gw.GetSettings()) != 4 {
		t.Fatalf("GetGatewayConfig = %v, %v; want revision 1, manual, the other keys unset", gw, err)
	}
	_, err = svc.UpdateConfig(aa, sandboxReq(stringSetting("auto"), false))
	apitest.WantErr(t, "UpdateConfig(sandbox, globally managed)", err, codes.FailedPrecondition,
		"setting 'proposal_approval_mode' is managed globally; delete the global setting before sandbox update")
	_, err = svc.UpdateConfig(aa, sandboxReq(nil, true))
	apitest.WantErr(t, "UpdateConfig(sandbox delete, globally managed)", err, codes.FailedPrecondition,
		"setting 'proposal_approval_mode' is managed globally; delete the global setting first")

	if del, err := svc.UpdateConfig(root, globalReq(nil, true)); err != nil || !del.GetDeleted() || del.GetSettingsRevision() != 2 {
		t.Fatalf("UpdateConfig(delete global) = %v, %v; want deleted, revision 2", del, err)
	}
	if e := effective(); e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_SANDBOX || e.GetValue().GetStringValue() != "auto" {
		t.Fatalf("after the global delete: %v, want auto from SANDBOX again", e)
	}
	if del, err := svc.UpdateConfig(aa, sandboxReq(nil, true)); err != nil || !del.GetDeleted() || del.GetSettingsRevision() != 2 {
		t.Fatalf("UpdateConfig(delete sandbox) = %v, %v; want deleted, revision 2", del, err)
	}
	if e := effective(); e.GetValue() != nil {
		t.Fatalf("after both deletes: %v, want unset", e)
	}
}

// Refusals: unknown keys, wrong kinds, reserved keys, merge operations,
// and requests asking for more or less than one change.
func TestUpdateConfigRefusals(t *testing.T) {
	svc, _, _ := setup(t)
	root := apitest.As(t.Context(), apitest.OIDCRoot)
	merge := []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "gh"}}}}
	for _, tc := range []struct {
		name string
		req  *openshellv1.UpdateConfigRequest
		code codes.Code
		msg  string
	}{
		{"unknown key, sandbox", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "log_lvl", SettingValue: stringSetting("x")},
			codes.InvalidArgument, "unknown setting key 'log_lvl'. Allowed keys: providers_v2_enabled, "},
		{"unknown key, global", &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "nope", DeleteSetting: true},
			codes.InvalidArgument, "unknown setting key 'nope'"},
		{"wrong kind", &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "providers_v2_enabled", SettingValue: stringSetting("true")},
			codes.InvalidArgument, "setting 'providers_v2_enabled' expects bool value"},
		{"no value", &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "providers_v2_enabled"},
			codes.InvalidArgument, "setting_value.value is required"},
		{"global-only key at sandbox scope", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "providers_v2_enabled", SettingValue: boolSetting(true)},
			codes.InvalidArgument, "setting 'providers_v2_enabled' cannot be set at sandbox scope"},
		{"policy key, sandbox", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "policy", DeleteSetting: true},
			codes.InvalidArgument, "reserved key 'policy' must be set via policy commands"},
		{"nothing", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a"},
			codes.InvalidArgument, "one of policy, setting_key, or merge_operations must be provided"},
		{"two things", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: livePolicy(), SettingKey: "ocsf_json_enabled"},
			codes.InvalidArgument, "policy, setting_key, and merge_operations are mutually exclusive"},
		{"malformed merge", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", MergeOperations: []*openshellv1.PolicyMergeOperation{
			{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "gh"}}}, {}}},
			codes.InvalidArgument, "merge_operations[1] is missing an operation"},
		{"merge, global", &openshellv1.UpdateConfigRequest{Global: true, MergeOperations: merge},
			codes.InvalidArgument, "merge_operations are not supported for global policy updates"},
		{"global annotations", &openshellv1.UpdateConfigRequest{Global: true, Policy: livePolicy(), Annotations: map[string]string{"a": "b"}},
			codes.InvalidArgument, "annotations are only supported for sandbox-scoped updates"},
		{"invalid annotation key", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: livePolicy(), Annotations: map[string]string{"-bad": "b"}},
			codes.InvalidArgument, "-bad"},
		{"merge into a provider rule", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", MergeOperations: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddRule{
			AddRule: &openshellv1.AddNetworkRule{RuleName: "_provider_gh", Rule: &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "a.test", Port: 443}}}}}}}},
			codes.InvalidArgument, "merge operation add_rule rule_name '_provider_gh' uses reserved '_provider_' prefix for provider composition"},
		{"merge a metadata host", &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", MergeOperations: []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_AddRule{
			AddRule: &openshellv1.AddNetworkRule{RuleName: "m", Rule: &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "169.254.169.254", Port: 80}}}}}}}},
			codes.InvalidArgument, "proposed rule endpoint host '169.254.169.254' is an always-blocked address"},
		{"global expected resource version", &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "ocsf_json_enabled", SettingValue: boolSetting(true), ExpectedResourceVersion: 3},
			codes.InvalidArgument, "expected_resource_version is only supported for sandbox-scoped updates"},
		{"no name", &openshellv1.UpdateConfigRequest{Workspace: "team-a", SettingKey: "ocsf_json_enabled", SettingValue: boolSetting(true)},
			codes.InvalidArgument, "name is required for sandbox-scoped updates"},
	} {
		_, err := svc.UpdateConfig(root, tc.req)
		apitest.WantErr(t, "UpdateConfig("+tc.name+")", err, tc.code, tc.msg)
	}
	gw, err := svc.GetGatewayConfig(root, &sandboxv1.GetGatewayConfigRequest{})
	if err != nil || gw.GetSettingsRevision() != 0 {
		t.Fatalf("after refusals: GetGatewayConfig = %v, %v; want nothing stored", gw, err)
	}
}

// TestGlobalAuthorization: global writes and reads of the global policy
// need a platform admin; sandbox settings need the workspace admin role;
// GetGatewayConfig is for every user; supervisors get none of it.
func TestGlobalAuthorization(t *testing.T) {
	svc, f, _ := setup(t)
	calls := []apitest.Call{
		{Name: "UpdateConfig(global policy)", Do: func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, Policy: globalPolicy()})
			return err
		}},
		{Name: "UpdateConfig(global setting)", Do: func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "ocsf_json_enabled", SettingValue: boolSetting(true)})
			return err
		}},
		{Name: "UpdateConfig(remove global policy)", Do: func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", DeleteSetting: true})
			return err
		}},
		{Name: "UpdateConfig(sandbox setting)", Do: func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "sb", Workspace: "team-a", SettingKey: "agent_policy_proposals_enabled", SettingValue: boolSetting(true)})
			return err
		}},
		{Name: "GetGatewayConfig", Do: func(ctx context.Context) error {
			_, err := svc.GetGatewayConfig(ctx, &sandboxv1.GetGatewayConfigRequest{})
			return err
		}},
		{Name: "ListSandboxPolicies(global)", Do: func(ctx context.Context) error {
			_, err := svc.ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Global: true})
			return err
		}},
		{Name: "GetSandboxPolicyStatus(global)", Do: func(ctx context.Context) error {
			_, err := svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Global: true, Version: 1})
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, ok, ok, ok}},
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, ok, ok, ok, ok}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{denied, denied, denied, ok, ok, denied, denied}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{denied, denied, denied, nf, ok, denied, denied}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{denied, denied, denied, nf, ok, denied, denied}},
		{Name: "supervisor", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{denied, denied, denied, denied, denied, denied, denied}},
	})
}

// A sandbox without a policy of its own that starts under a global policy
// takes it as its version 1: its supervisor's report lands there (it used
// to be NotFound, and the supervisor never started), and the sandbox keeps
// that policy once the global one is removed.
func TestGlobalPolicyBecomesBaselineOfPolicylessSandbox(t *testing.T) {
	svc, f, _ := setup(t)
	root := apitest.As(t.Context(), apitest.OIDCRoot)
	if _, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, Policy: globalPolicy()}); err != nil {
		t.Fatal(err)
	}
	cfg := config(t, svc, f.SandboxA)
	if cfg.GetVersion() != 1 || cfg.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL || !proto.Equal(cfg.GetPolicy(), globalPolicy()) {
		t.Fatalf("GetSandboxConfig(policyless sandbox) = %v; want version 1 of the global policy", cfg)
	}
	sup := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	if _, err := svc.ReportPolicyStatus(sup, &openshellv1.ReportPolicyStatusRequest{SandboxId: f.SandboxA, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED}); err != nil {
		t.Fatalf("ReportPolicyStatus(1) = %v", err)
	}
	if _, err := svc.UpdateConfig(root, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", DeleteSetting: true}); err != nil {
		t.Fatal(err)
	}
	if cfg := config(t, svc, f.SandboxA); cfg.GetVersion() != 1 || cfg.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX || !proto.Equal(cfg.GetPolicy(), globalPolicy()) {
		t.Fatalf("after removal: %v; want its own version 1 (the former global policy)", cfg)
	}
}

// TestUpdateConfigAnnotations: annotations of a sandbox-scoped update are
// merged into the sandbox's metadata (in the response too) and kept as the
// new revision's provenance; expected_resource_version makes the update a
// compare-and-swap on the sandbox, and a stale one stores nothing.
func TestUpdateConfigAnnotations(t *testing.T) {
	svc, f, id := setup(t)
	admin := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	rv := func() uint64 {
		t.Helper()
		sb, err := f.Engine.GetByID(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return sb.GetMetadata().GetResourceVersion()
	}
	next := livePolicy()
	next.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}

	stale := rv() + 7
	_, err := svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: next, Annotations: map[string]string{"ticket": "T-1"}, ExpectedResourceVersion: stale})
	apitest.WantErr(t, "UpdateConfig(stale version)", err, codes.Aborted, "was modified concurrently")
	if st := status(admin, t, svc, 0); st.GetRevision().GetVersion() != 1 {
		t.Fatalf("a refused update stored version %d", st.GetRevision().GetVersion())
	}

	r, err := svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: next, Annotations: map[string]string{"ticket": "T-1"}, ExpectedResourceVersion: rv()})
	if err != nil || r.GetVersion() != 2 || r.GetAnnotations()["ticket"] != "T-1" {
		t.Fatalf("UpdateConfig(policy, annotations) = %v, %v; want version 2 with the annotation", r, err)
	}
	if st := status(admin, t, svc, 2); st.GetRevision().GetProvenance()["ticket"] != "T-1" {
		t.Errorf("revision 2 provenance = %v", st.GetRevision().GetProvenance())
	}
	if sb, _ := f.Engine.GetByID(t.Context(), id); sb.GetMetadata().GetAnnotations()["ticket"] != "T-1" {
		t.Errorf("sandbox annotations = %v", sb.GetMetadata().GetAnnotations())
	}

	merge := []*openshellv1.PolicyMergeOperation{{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "pypi"}}}}
	r, err = svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", MergeOperations: merge, Annotations: map[string]string{"reviewer": "aa"}})
	if err != nil || r.GetVersion() != 3 || r.GetAnnotations()["ticket"] != "T-1" || r.GetAnnotations()["reviewer"] != "aa" {
		t.Fatalf("UpdateConfig(merge, annotations) = %v, %v; want version 3 with both annotations", r, err)
	}
	if p := status(admin, t, svc, 3).GetRevision().GetPolicy(); p.GetNetworkPolicies()["pypi"] != nil || p.GetNetworkPolicies()["gh"] == nil {
		t.Errorf("merged policy = %v, want gh without pypi", p)
	}

	_, err = svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "ocsf_json_enabled", SettingValue: boolSetting(true), ExpectedResourceVersion: stale})
	apitest.WantErr(t, "UpdateConfig(setting, stale version)", err, codes.Aborted, "was modified concurrently")
	r, err = svc.UpdateConfig(admin, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", SettingKey: "ocsf_json_enabled", SettingValue: boolSetting(true),
		Annotations: map[string]string{"ticket": "T-2"}, ExpectedResourceVersion: rv()})
	if err != nil || r.GetSettingsRevision() != 1 || r.GetAnnotations()["ticket"] != "T-2" {
		t.Fatalf("UpdateConfig(setting, annotations) = %v, %v; want settings revision 1 (the stale one stored nothing) and the new annotation", r, err)
	}
}
