package settings_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/settings"
)

func TestResolveUnknownKey(t *testing.T) {
	_, err := settings.Resolve("no_such_key")
	const want = "unknown setting key 'no_such_key'. Allowed keys: providers_v2_enabled, ocsf_json_enabled, agent_policy_proposals_enabled, proposal_approval_mode"
	if errdefs.Code(err) != codes.InvalidArgument || err.Error() != want {
		t.Fatalf("Resolve(no_such_key) = %v, want InvalidArgument %q", err, want)
	}
	if _, err := settings.Resolve(settings.PolicyKey); err == nil {
		t.Fatal("Resolve(policy) = nil, want the reserved key refused")
	}
}

func TestCheck(t *testing.T) {
	str := func(s string) *sandboxv1.SettingValue {
		return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: s}}
	}
	bl := &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: true}}
	by := &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BytesValue{BytesValue: []byte{1}}}
	for _, tc := range []struct {
		key   string
		scope settings.Scope
		v     *sandboxv1.SettingValue
		want  string // "" = accepted
	}{
		{"proposal_approval_mode", settings.ScopeSandbox, str("auto"), ""},
		{"proposal_approval_mode", settings.ScopeGlobal, str("autom"), "setting 'proposal_approval_mode' expects one of [manual, auto]; got 'autom'"},
		{"proposal_approval_mode", settings.ScopeGlobal, bl, "setting 'proposal_approval_mode' expects string value"},
		{"ocsf_json_enabled", settings.ScopeSandbox, bl, ""},
		{"ocsf_json_enabled", settings.ScopeSandbox, str("true"), "setting 'ocsf_json_enabled' expects bool value"},
		{"ocsf_json_enabled", settings.ScopeSandbox, by, "setting 'ocsf_json_enabled' expects bool value; bytes are not supported for this key"},
		{"ocsf_json_enabled", settings.ScopeSandbox, &sandboxv1.SettingValue{}, "setting_value.value is required"},
		{"providers_v2_enabled", settings.ScopeGlobal, bl, ""},
		{"providers_v2_enabled", settings.ScopeSandbox, bl, "setting 'providers_v2_enabled' cannot be set at sandbox scope"},
	} {
		k, err := settings.Resolve(tc.key)
		if err != nil {
			t.Fatal(err)
		}
		err = k.Check(tc.scope, tc.v)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Check(%s, %v) = %v, want accepted", tc.key, tc.v, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want || errdefs.Code(err) != codes.InvalidArgument):
			t.Errorf("Check(%s, %v) = %v, want InvalidArgument %q", tc.key, tc.v, err, tc.want)
		}
	}
}

// A global value wins over a sandbox value; every registered key is
// present; keys no longer registered are dropped.
func TestEffective(t *testing.T) {
	tr := &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: true}}
	fa := &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: false}}
	got := settings.Effective(
		map[string]*sandboxv1.SettingValue{"ocsf_json_enabled": tr, "gone": tr},
		map[string]*sandboxv1.SettingValue{"ocsf_json_enabled": fa, "agent_policy_proposals_enabled": fa},
	)
	if len(got) != len(settings.Registered) {
		t.Errorf("Effective has %d keys, want %d", len(got), len(settings.Registered))
	}
	if e := got["ocsf_json_enabled"]; e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL || !e.GetValue().GetBoolValue() {
		t.Errorf("ocsf_json_enabled = %v, want true from GLOBAL", e)
	}
	if e := got["agent_policy_proposals_enabled"]; e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_SANDBOX || e.GetValue() == nil {
		t.Errorf("agent_policy_proposals_enabled = %v, want false from SANDBOX", e)
	}
	if e := got["proposal_approval_mode"]; e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_UNSPECIFIED || e.GetValue() != nil {
		t.Errorf("proposal_approval_mode = %v, want unset", e)
	}
	if _, ok := got["gone"]; ok {
		t.Error("an unregistered stored key is delivered")
	}
}
