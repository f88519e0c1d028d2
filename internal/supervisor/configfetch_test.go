package supervisor

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	policyrules "github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/settings"
)

// The supervisor's copies of the gateway's facts that seededConfig
// relies on: its policy hash and the setting that adds provider rules.
func TestSeededConfigGatewayFacts(t *testing.T) {
	if got, want := policyHash(defaultPolicy()), policyrules.Hash(defaultPolicy()); got != want {
		t.Errorf("policyHash(defaultPolicy()) = %s, want the gateway's %s", got, want)
	}
	if _, err := settings.Resolve(providersV2Setting); err != nil {
		t.Errorf("settings.Resolve(%q): %v", providersV2Setting, err)
	}
}

// seedClient is a gateway that serves a sandbox without a policy until
// the supervisor seeds one; the seeded policy is then served with extra
// added when extra is set (as provider rules are composed). It counts
// the calls to GetSandboxConfig.
type seedClient struct {
	openshellv1.OpenShellClient
	mu       sync.Mutex
	settings map[string]*sandboxv1.EffectiveSetting
	source   sandboxv1.PolicySource
	extra    string // a network rule the gateway adds to the served policy
	stored   *sandboxv1.SandboxPolicy
	hash     string // overrides the stored revision's hash in UpdateConfig's answer
	fetches  int
}

func (c *seedClient) served() *sandboxv1.SandboxPolicy {
	if c.stored == nil || c.extra == "" {
		return c.stored
	}
	p := proto.Clone(c.stored).(*sandboxv1.SandboxPolicy)
	p.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{c.extra: {Name: c.extra}}
	return p
}

func (c *seedClient) GetSandboxConfig(context.Context, *sandboxv1.GetSandboxConfigRequest, ...grpc.CallOption) (*sandboxv1.GetSandboxConfigResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fetches++
	resp := &sandboxv1.GetSandboxConfigResponse{Settings: c.settings, PolicySource: c.source, ConfigRevision: 7}
	if p := c.served(); p != nil {
		resp.Policy, resp.Version, resp.PolicyHash = p, 1, policyrules.Hash(p)
		resp.ConfigRevision = 8
	}
	return resp, nil
}

func (c *seedClient) UpdateConfig(_ context.Context, req *openshellv1.UpdateConfigRequest, _ ...grpc.CallOption) (*openshellv1.UpdateConfigResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stored = req.GetPolicy()
	h := policyrules.Hash(c.stored)
	if c.hash != "" {
		h = c.hash
	}
	return &openshellv1.UpdateConfigResponse{Version: 1, PolicyHash: h}, nil
}

func boolSetting(on bool) *sandboxv1.EffectiveSetting {
	return &sandboxv1.EffectiveSetting{Value: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}, Scope: sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL}
}

// TestFetchConfigSeed: a sandbox without a policy gets the default one
// seeded; the configuration the supervisor enforces is the one the
// gateway serves afterwards. It is taken from UpdateConfig's answer (one
// GetSandboxConfig in all) only when the gateway stored exactly the
// default policy and serves it unchanged; otherwise it is fetched again.
func TestFetchConfigSeed(t *testing.T) {
	off := map[string]*sandboxv1.EffectiveSetting{providersV2Setting: {}, "ocsf_json_enabled": boolSetting(true)}
	for _, tc := range []struct {
		name        string
		c           *seedClient
		wantFetches int
	}{
		{"providers v2 unset", &seedClient{settings: off}, 1},
		{"providers v2 off", &seedClient{settings: map[string]*sandboxv1.EffectiveSetting{providersV2Setting: boolSetting(false)}}, 1},
		{"providers v2 on: rules composed", &seedClient{settings: map[string]*sandboxv1.EffectiveSetting{providersV2Setting: boolSetting(true)}, extra: "_provider_svc"}, 2},
		{"setting unknown to the gateway", &seedClient{settings: map[string]*sandboxv1.EffectiveSetting{}}, 2},
		{"stored policy differs", &seedClient{settings: off, hash: "0123"}, 2},
		{"global source", &seedClient{settings: off, source: sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{SandboxID: "sb-1", SandboxName: "sb", StartupTimeout: time.Minute}
			got, err := fetchConfig(t.Context(), slog.New(slog.NewTextHandler(t.Output(), nil)), tc.c, cfg, time.Now().Add(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if tc.c.fetches != tc.wantFetches {
				t.Errorf("GetSandboxConfig calls = %d, want %d", tc.c.fetches, tc.wantFetches)
			}
			// What the gateway serves now, and what the supervisor took.
			want, err := tc.c.GetSandboxConfig(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantFetches == 1 {
				// Taken from UpdateConfig's answer: the new
				// fingerprint is not known, and the first one's is
				// not passed on as if it were.
				want.ConfigRevision = 0
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("fetchConfig() differs from what the gateway serves (-want +got):\n%s", diff)
			}
		})
	}
}
