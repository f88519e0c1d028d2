package interceptor

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestStartupRefusesInvalidManifests: each invalid manifest stops Start
// with a message naming the interceptor and the fault.
func TestStartupRefusesInvalidManifests(t *testing.T) {
	cases := []struct {
		name     string
		manifest string
		tweak    func(*Config)
		want     string
	}{
		{"binding without id", manifest("", bind("", rpcCreateProvider, "", Validate)), nil, "a binding has no id"},
		{"duplicate id", manifest("", bind("a", rpcCreateProvider, "", Validate), bind("a", rpcUpdateConfig, "", Validate)), nil, `binding id "a" declared twice`},
		{"unknown service", manifest("", bind("a", "openshell.v9.Nope/CreateProvider", "", Validate)), nil, "no service openshell.v9.Nope"},
		{"unknown method", manifest("", bind("a", "openshell.v1.OpenShell/Nope", "", Validate)), nil, "has no method Nope"},
		{"streaming method", manifest("", bind("a", "openshell.v1.OpenShell/ExecSandbox", "", Validate)), nil, "is streaming"},
		{"not interceptable", manifest("", bind("a", "openshell.v1.OpenShell/GetSandbox", "", Validate)), nil, "is not interceptable"},
		{"other service", manifest("", bind("a", "openshell.inference.v1.Inference/SetInferenceRoute", "", Validate)), nil, "is not interceptable"},
		{"no phases", manifest("", bind("a", rpcCreateProvider, "")), nil, "no phases"},
		{"unspecified phase", manifest("", bind("a", rpcCreateProvider, "", gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_UNSPECIFIED)), nil, "is not one of"},
		{"phase twice", manifest("", bind("a", rpcCreateProvider, "", Validate, Validate)), nil, "listed twice"},
		{"two bindings same rpc and phase", manifest("", bind("a", rpcCreateProvider, "", Validate), bind("b", rpcCreateProvider, "", Validate)), nil, "declared by two bindings"},
		{"bad binding failure policy", manifest("", bind("a", rpcCreateProvider, "sometimes", Validate)), nil, `failure_policy "sometimes"`},
		{"bad manifest failure policy", manifest("never", bind("a", rpcCreateProvider, "", Validate)), nil, `failure_policy "never"`},
		{"post_commit fail_closed by default", manifest("", bind("a", rpcCreateProvider, "", PostCommit)), nil, "post_commit is observational and needs failure_policy fail_open"},
		{"post_commit fail_closed by config", manifest("", bind("a", rpcCreateProvider, "fail_open", PostCommit)), func(c *Config) { c.FailurePolicy = FailClosed }, "needs failure_policy fail_open"},
		{"audience mismatch", `{"name":"x","expectedAudience":"urn:other"}`, nil, `manifest expects audience "urn:other"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, tc.manifest, "allow", "")
			c := config("bad", f)
			if tc.tweak != nil {
				tc.tweak(&c)
			}
			_, err := Start(t.Context(), Options{Configs: []Config{c}, Logger: testLogger(t)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), `interceptor "bad": `) {
				t.Fatalf("Start = %v, want an error naming the interceptor and containing %q", err, tc.want)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		c := Config{Name: "gone", Endpoint: "http://127.0.0.1:1", AllowInsecureTransport: true, Timeout: 300 * time.Millisecond, MaxResponseBytes: DefaultMaxResponseBytes}
		_, err := Start(t.Context(), Options{Configs: []Config{c}})
		if err == nil || !strings.Contains(err.Error(), `interceptor "gone": describe:`) {
			t.Fatalf("Start = %v, want a describe error", err)
		}
	})
}

// TestBindingPolicies: dynamic takes the manifest; allowlist takes manifest
// bindings inside the configured RPC/phase set; exact needs both sets
// equal. Strict policies compare RPCs and phases, never binding ids.
func TestBindingPolicies(t *testing.T) {
	declared := manifest("", bind("any-id", rpcCreateProvider, "", Validate))
	cases := []struct {
		name   string
		policy BindingPolicy
		cfg    []BindingConfig
		want   string // "" = starts
	}{
		{"dynamic", Dynamic, nil, ""},
		{"allowlist same set", Allowlist, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{Validate}}}, ""},
		{"allowlist wider set", Allowlist, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{ModifyOperation, Validate}}, {RPC: rpcUpdateConfig, Phases: []Phase{Validate}}}, ""},
		{"allowlist other phase", Allowlist, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{ModifyOperation}}}, "validate is not configured (binding_policy allowlist)"},
		{"allowlist other rpc", Allowlist, []BindingConfig{{RPC: rpcUpdateConfig, Phases: []Phase{Validate}}}, "is not configured"},
		{"exact same set", Exact, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{Validate}}}, ""},
		{"exact wider set", Exact, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{Validate}}, {RPC: rpcUpdateConfig, Phases: []Phase{Validate}}}, "configured but not declared by the manifest: openshell.v1.OpenShell/UpdateConfig validate"},
		{"exact narrower set", Exact, []BindingConfig{{RPC: rpcUpdateConfig, Phases: []Phase{Validate}}}, "is not configured (binding_policy exact)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, declared, "deny", "")
			c := config("p", f)
			c.BindingPolicy, c.Bindings = tc.policy, tc.cfg
			rt, err := Start(t.Context(), Options{Configs: []Config{c}, Logger: testLogger(t)})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Start = %v, want error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			t.Cleanup(rt.Close)
			client, _, _ := serve(t, rt)
			if _, err := client.CreateProvider(t.Context(), providerReq()); status.Code(err) != codes.FailedPrecondition {
				t.Errorf("CreateProvider = %v, want the bound validate to veto it", err)
			}
		})
	}
	// Renaming the manifest binding does not change what an exact policy
	// admits: the RPC and phase are what count.
	f := startFake(t, manifest("", bind("renamed-binding", rpcCreateProvider, "", Validate)), "allow", "")
	c := config("p", f)
	c.BindingPolicy, c.Bindings = Exact, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{Validate}}}
	if _, err := Start(t.Context(), Options{Configs: []Config{c}}); err != nil {
		t.Errorf("exact with a renamed binding: %v", err)
	}
}

// TestFailurePolicyOverride: the operator's per-RPC failure_policy wins
// over the manifest's.
func TestFailurePolicyOverride(t *testing.T) {
	f := startFake(t, manifest("fail_closed", bind("b", rpcCreateProvider, "fail_closed", Validate)), "crash", "")
	c := config("p", f)
	c.BindingPolicy, c.Bindings = Allowlist, []BindingConfig{{RPC: rpcCreateProvider, Phases: []Phase{Validate}, FailurePolicy: FailOpen}}
	client, _, api := serve(t, start(t, c))
	if _, err := client.CreateProvider(t.Context(), providerReq()); err != nil || len(api.received()) != 1 {
		t.Fatalf("CreateProvider = %v with the operator's fail_open override", err)
	}
}

// TestInterceptableAllowlist: every listed method exists, is unary and
// belongs to openshell.v1.OpenShell; SubmitPolicyAnalysis is listed; reads
// and streams are not.
func TestInterceptableAllowlist(t *testing.T) {
	for _, m := range interceptable {
		if _, err := resolveRPC(openShellService + "/" + m); err != nil {
			t.Errorf("allowlisted %s: %v", m, err)
		}
	}
	if !Interceptable("/openshell.v1.OpenShell/SubmitPolicyAnalysis") {
		t.Error("SubmitPolicyAnalysis is not interceptable")
	}
	for _, m := range []string{"GetSandbox", "ListProviders", "Health", "ExecSandbox", "ConnectSupervisor", "IssueSandboxToken", "WatchSandbox"} {
		if Interceptable("/openshell.v1.OpenShell/" + m) {
			t.Errorf("%s is interceptable", m)
		}
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(openShellService)
	if err != nil {
		t.Fatal(err)
	}
	n := d.(protoreflect.ServiceDescriptor).Methods().Len()
	t.Logf("%d of %d OpenShell methods are interceptable", len(interceptable), n)
}

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (rawCodec) Name() string                    { return "proto" }

// TestOneofLastMemberWins: binary input with two members of one oneof
// group is decoded with the last one on the wire; the interceptor and the
// handler see the same single member.
func TestOneofLastMemberWins(t *testing.T) {
	f := startFake(t, manifest("", bind("m", rpcUpdateConfig, "", ModifyOperation)), "allow",
		`[{"op":"add","path":"/annotations","value":{"seen":"yes"}}]`)
	_, conn, api := serve(t, start(t, config("p", f)))

	// PolicyMergeOperation{remove_endpoint(2){rule_name:"first"}, remove_rule(3){rule_name:"last"}}
	var op []byte
	first := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "first")
	last := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "last")
	op = protowire.AppendBytes(protowire.AppendTag(op, 2, protowire.BytesType), first)
	op = protowire.AppendBytes(protowire.AppendTag(op, 3, protowire.BytesType), last)
	req := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "sb") // name
	req = protowire.AppendBytes(protowire.AppendTag(req, 7, protowire.BytesType), op)     // merge_operations
	resp := &openshellv1.UpdateConfigResponse{}
	if err := conn.Invoke(t.Context(), "/openshell.v1.OpenShell/UpdateConfig", req, resp, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Fatalf("UpdateConfig: %v", err)
	}
	got := api.received()
	if len(got) != 1 {
		t.Fatalf("handler runs = %d", len(got))
	}
	h := got[0].(*openshellv1.UpdateConfigRequest)
	if mo := h.GetMergeOperations(); len(mo) != 1 || mo[0].GetRemoveRule().GetRuleName() != "last" || mo[0].GetRemoveEndpoint() != nil {
		t.Errorf("handler merge_operations = %v, want only remove_rule \"last\"", mo)
	}
	if h.GetAnnotations()["seen"] != "yes" {
		t.Errorf("handler annotations = %v, want the patched one", h.GetAnnotations())
	}
	evs, _ := f.evaluations(t)
	if len(evs) != 1 {
		t.Fatalf("evaluations = %d", len(evs))
	}
	ops := evs[0].GetModifyOperation().GetProposedOperation().GetFields()["mergeOperations"].GetListValue().GetValues()
	if len(ops) != 1 {
		t.Fatalf("interceptor mergeOperations = %v", ops)
	}
	fields := ops[0].GetStructValue().GetFields()
	if _, ok := fields["removeEndpoint"]; ok || fields["removeRule"].GetStructValue().GetFields()["ruleName"].GetStringValue() != "last" {
		t.Errorf("interceptor saw %v, want only removeRule \"last\"", fields)
	}
}
