// Package settings is the registry of the runtime setting keys the gateway
// accepts in UpdateConfig (setting_key), and the store of setting values at
// gateway (global) and sandbox scope.
//
// The registry is a fixed table (Registered): each key has a value kind
// (string, bool, int, bytes), the scopes it may be set at, a default that
// holds while it is unset, an optional validation, and a note saying what
// reads it. The keys are OpenShell's; the gateway stores and delivers them
// (GetGatewayConfig, GetSandboxConfig) whether or not a component of this
// implementation acts on them yet: Key.Effect says which do (docs/policy.md
// lists them). An unknown key is InvalidArgument naming it and the allowed
// keys, as OpenShell answers.
//
// Values are kept as versioned snapshots (Store): every change writes the
// whole map of a scope as the next version, and that version is the scope's
// settings revision. A write is a compare-and-swap on the version it read,
// so two writers (goroutines or gateway replicas) never interleave: the
// loser gets errdefs.ErrConflict (gRPC Aborted) and nothing of its change is
// stored.
package settings

import (
	"fmt"
	"slices"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Kind is the value kind of a setting.
type Kind int

// Value kinds.
const (
	String Kind = iota + 1
	Bool
	Int
	Bytes
)

// String returns the kind's name as used in error texts.
func (k Kind) String() string {
	switch k {
	case String:
		return "string"
	case Bool:
		return "bool"
	case Int:
		return "int"
	case Bytes:
		return "bytes"
	}
	return "unknown"
}

// Scope says where a key may be set.
type Scope uint8

// Scopes; a key may allow both.
const (
	ScopeSandbox Scope = 1 << iota
	ScopeGlobal
)

// Key describes one registered setting.
type Key struct {
	Name    string
	Kind    Kind
	Scopes  Scope
	Default *sandboxv1.SettingValue // the value in force while unset
	// Allowed, for string keys, is the closed set of accepted values
	// (nil: any string).
	Allowed []string
	// Effect says which component of this gateway acts on the key; empty
	// means none does yet: the value is stored and delivered only.
	Effect string
}

// PolicyKey is reserved: the global policy lives under it in OpenShell's
// model. It cannot be set as a setting; deleting it at global scope
// removes the global policy.
const PolicyKey = "policy"

func boolValue(b bool) *sandboxv1.SettingValue {
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: b}}
}

func stringValue(s string) *sandboxv1.SettingValue {
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: s}}
}

// Registered is the registry, in the order error texts list it. These are
// OpenShell's keys (crates/openshell-core/src/settings.rs); Effect names
// the component acting on a key (empty: none yet), as docs/policy.md
// states.
var Registered = []Key{
	{Name: "providers_v2_enabled", Kind: Bool, Scopes: ScopeGlobal, Default: boolValue(false),
		Effect: "gateway: provider profiles contribute network rules to sandbox policies (internal/api/policy, internal/providers)"},
	{Name: "ocsf_json_enabled", Kind: Bool, Scopes: ScopeSandbox | ScopeGlobal, Default: boolValue(false)},
	{Name: "agent_policy_proposals_enabled", Kind: Bool, Scopes: ScopeSandbox | ScopeGlobal, Default: boolValue(false),
		Effect: "supervisor: true serves the policy.local agent proposal API inside the sandbox (internal/supervisor)"},
	{Name: "proposal_approval_mode", Kind: String, Scopes: ScopeSandbox | ScopeGlobal, Default: stringValue("manual"), Allowed: []string{"manual", "auto"},
		Effect: "gateway: auto approves policy advisor proposals without prover findings or security notes (internal/policy/advisor)"},
}

// Lookup returns the registered key name.
func Lookup(name string) (Key, bool) {
	i := slices.IndexFunc(Registered, func(k Key) bool { return k.Name == name })
	if i < 0 {
		return Key{}, false
	}
	return Registered[i], true
}

// Names returns the registered key names, comma separated.
func Names() string {
	names := make([]string, len(Registered))
	for i, k := range Registered {
		names[i] = k.Name
	}
	return strings.Join(names, ", ")
}

// Resolve returns the registered key name or InvalidArgument naming it
// (OpenShell's text).
func Resolve(name string) (Key, error) {
	k, ok := Lookup(name)
	if !ok {
		return Key{}, errdefs.InvalidArgument(fmt.Sprintf("unknown setting key '%s'. Allowed keys: %s", name, Names()))
	}
	return k, nil
}

// Check validates v for k at scope (ScopeSandbox or ScopeGlobal):
// the kind must match, a string must be one of Allowed, and k must be
// settable at scope.
func (k Key) Check(scope Scope, v *sandboxv1.SettingValue) error {
	if k.Scopes&scope == 0 {
		where := "sandbox"
		if scope == ScopeGlobal {
			where = "global"
		}
		return errdefs.InvalidArgument(fmt.Sprintf("setting '%s' cannot be set at %s scope", k.Name, where))
	}
	if v.GetValue() == nil {
		return errdefs.InvalidArgument("setting_value.value is required")
	}
	if got := KindOf(v); got != k.Kind {
		if got == Bytes {
			return errdefs.InvalidArgument(fmt.Sprintf("setting '%s' expects %s value; bytes are not supported for this key", k.Name, k.Kind))
		}
		return errdefs.InvalidArgument(fmt.Sprintf("setting '%s' expects %s value", k.Name, k.Kind))
	}
	if s, ok := v.GetValue().(*sandboxv1.SettingValue_StringValue); ok && k.Allowed != nil && !slices.Contains(k.Allowed, s.StringValue) {
		return errdefs.InvalidArgument(fmt.Sprintf("setting '%s' expects one of [%s]; got '%s'", k.Name, strings.Join(k.Allowed, ", "), s.StringValue))
	}
	return nil
}

// KindOf returns the kind of v's value, 0 when unset.
func KindOf(v *sandboxv1.SettingValue) Kind {
	switch v.GetValue().(type) {
	case *sandboxv1.SettingValue_StringValue:
		return String
	case *sandboxv1.SettingValue_BoolValue:
		return Bool
	case *sandboxv1.SettingValue_IntValue:
		return Int
	case *sandboxv1.SettingValue_BytesValue:
		return Bytes
	}
	return 0
}

// Effective merges the global and sandbox values into what a sandbox is
// to use, as OpenShell: every registered key is present; a global value
// wins over a sandbox value (scope GLOBAL), a sandbox value is scope
// SANDBOX, and an unset key has no value and scope UNSPECIFIED (its
// Default holds). Stored keys that are no longer registered are left out.
func Effective(global, sandbox map[string]*sandboxv1.SettingValue) map[string]*sandboxv1.EffectiveSetting {
	out := make(map[string]*sandboxv1.EffectiveSetting, len(Registered))
	for _, k := range Registered {
		e := &sandboxv1.EffectiveSetting{}
		if v, ok := global[k.Name]; ok {
			e.Value, e.Scope = v, sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL
		} else if v, ok := sandbox[k.Name]; ok {
			e.Value, e.Scope = v, sandboxv1.SettingScope_SETTING_SCOPE_SANDBOX
		}
		out[k.Name] = e
	}
	return out
}

// Gateway is the map GetGatewayConfig answers: every registered key, with
// an empty SettingValue when unset at global scope.
func Gateway(global map[string]*sandboxv1.SettingValue) map[string]*sandboxv1.SettingValue {
	out := make(map[string]*sandboxv1.SettingValue, len(Registered))
	for _, k := range Registered {
		if v, ok := global[k.Name]; ok {
			out[k.Name] = v
		} else {
			out[k.Name] = &sandboxv1.SettingValue{}
		}
	}
	return out
}
