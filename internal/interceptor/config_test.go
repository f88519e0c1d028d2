package interceptor

import (
	"strings"
	"testing"
	"time"
)

func TestParseConfigs(t *testing.T) {
	good := map[string]any{
		"name": "quota", "grpc_endpoint": "unix:///run/quota.sock", "order": int64(10), "failure_policy": "fail_open",
		"binding_policy": "allowlist", "timeout": "250ms", "max_patches": int64(4),
		"bindings": []any{map[string]any{"rpc": rpcCreateProvider, "phases": []any{"modify_operation", "validate"}, "failure_policy": "fail_closed"}},
	}
	cs, err := ParseConfigs([]map[string]any{good})
	if err != nil {
		t.Fatalf("ParseConfigs: %v", err)
	}
	c := cs[0]
	if c.Timeout != 250*time.Millisecond || c.MaxPatches != 4 || c.Audience != "urn:openshell:extension:interceptor:quota" ||
		c.BindingPolicy != Allowlist || len(c.Bindings) != 1 || len(c.Bindings[0].Phases) != 2 || c.Bindings[0].FailurePolicy != FailClosed {
		t.Errorf("ParseConfigs = %+v", c)
	}
	with := func(k string, v any) map[string]any {
		m := map[string]any{"name": "x", "grpc_endpoint": "unix:///s"}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	bad := []struct {
		name string
		raw  map[string]any
		want string
	}{
		{"unknown key", with("colour", "red"), "unknown key"},
		{"bad name", with("name", "Bad Name"), "name"},
		{"no endpoint", with("grpc_endpoint", nil), "grpc_endpoint"},
		{"plaintext", with("grpc_endpoint", "http://127.0.0.1:1"), "allow_insecure_transport"},
		{"scheme", with("grpc_endpoint", "tcp://x"), "want https://"},
		{"ca without https", with("tls_ca_cert_path", "/ca.pem"), "tls_ca_cert_path"},
		{"timeout unit", with("timeout", "1m"), "timeout"},
		{"timeout small", with("timeout", "5ms"), "10ms-30s"},
		{"timeout large", with("timeout", "31s"), "10ms-30s"},
		{"failure policy", with("failure_policy", "maybe"), "failure_policy"},
		{"binding policy", with("binding_policy", "loose"), "binding_policy"},
		{"strict without bindings", with("binding_policy", "exact"), "needs at least one"},
		{"dynamic with bindings", with("bindings", []any{map[string]any{"rpc": rpcCreateProvider, "phases": []any{"validate"}}}), "only with binding_policy"},
		{"max patches", with("max_patches", int64(0)), "max_patches"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfigs([]map[string]any{tc.raw})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfigs = %v, want error containing %q", err, tc.want)
			}
		})
	}
	strictBinding := func(b map[string]any) map[string]any {
		m := with("binding_policy", "exact")
		m["bindings"] = []any{b}
		return m
	}
	for name, tc := range map[string]struct {
		b    map[string]any
		want string
	}{
		"unknown rpc":    {map[string]any{"rpc": "openshell.v1.OpenShell/Nope", "phases": []any{"validate"}}, "has no method"},
		"read rpc":       {map[string]any{"rpc": "openshell.v1.OpenShell/GetProvider", "phases": []any{"validate"}}, "not interceptable"},
		"bad phase":      {map[string]any{"rpc": rpcCreateProvider, "phases": []any{"pre"}}, `phase "pre"`},
		"no phases":      {map[string]any{"rpc": rpcCreateProvider}, "phases is empty"},
		"unknown subkey": {map[string]any{"rpc": rpcCreateProvider, "phases": []any{"validate"}, "id": "x"}, "unknown key"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfigs([]map[string]any{strictBinding(tc.b)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfigs = %v, want error containing %q", err, tc.want)
			}
		})
	}
	if _, err := ParseConfigs([]map[string]any{with("order", int64(1)), with("order", int64(2))}); err == nil || !strings.Contains(err.Error(), "configured twice") {
		t.Errorf("duplicate names: %v", err)
	}
}
