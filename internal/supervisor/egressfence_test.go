package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// TestEnforcementUnfenced: in fence mode a fence that could not be
// installed fails the policy whatever its network rules, since not even
// "no network_policies, no egress" holds; other network errors still
// count only when the policy has rules.
func TestEnforcementUnfenced(t *testing.T) {
	unfenced := fmt.Errorf("%w: nftables fence: install table inet openshell_fence: operation not permitted", errAgentNetworkOpen)
	rules := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"pypi": {}}}
	for _, tt := range []struct {
		name   string
		policy *sandboxv1.SandboxPolicy
		netErr error
		want   string // "" = LOADED
	}{
		{"no rules, fence missing", &sandboxv1.SandboxPolicy{}, unfenced,
			"the policy allows no egress, but this is not enforced: agent processes are not fenced off the pod's network: nftables fence: install table inet openshell_fence: operation not permitted"},
		{"rules, fence missing", rules, unfenced,
			"network policies are not enforced as written: agent processes are not fenced off the pod's network: nftables fence: install table inet openshell_fence: operation not permitted (rules: pypi)"},
		{"no rules, other network error", &sandboxv1.SandboxPolicy{}, errors.New("no egress proxy runs"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := enforcement(tt.policy, nil, tt.netErr); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("enforcement() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEgressLoadWithFence: the fence's error is part of every load and
// reload result, while the proxy's rules are still installed.
func TestEgressLoadWithFence(t *testing.T) {
	unfenced := fmt.Errorf("%w: no CAP_NET_ADMIN", errAgentNetworkOpen)
	e := &egressRunner{proxy: egress.New(egress.Config{}, nil), fenceMode: true, fenceErr: unfenced}
	plain := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/git"}}}}}
	bad := &sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Tls: "terminate"}}}}}
	if err := e.load(plain); !errors.Is(err, errAgentNetworkOpen) {
		t.Errorf("load(plain) = %v, want the fence's error", err)
	}
	if err := e.reload(plain); !errors.Is(err, errAgentNetworkOpen) {
		t.Errorf("reload(plain) = %v, want the fence's error", err)
	}
	if err := e.reload(bad); !errors.Is(err, errAgentNetworkOpen) || !strings.Contains(err.Error(), "previous network rules stay in force") {
		t.Errorf("reload(bad) = %v, want the fence's error and the rules' error", err)
	}
	fenced := &egressRunner{proxy: egress.New(egress.Config{}, nil), fenceMode: true}
	if err := fenced.load(plain); err != nil {
		t.Errorf("load(plain) with the fence installed = %v, want nil", err)
	}
}

func TestConfigEgressFence(t *testing.T) {
	base := func() Config { return Config{Endpoint: "https://gw:8443", SandboxID: "sb"} }
	for _, tt := range []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"nftables", func(c *Config) { c.EgressFence = "nftables" }, ""},
		{"unknown fence", func(c *Config) { c.EgressFence = "iptables" }, `OPENSHELL_EGRESS_FENCE: "iptables" is not a fence this supervisor installs (only "nftables")`},
		{"with a private network", func(c *Config) {
			c.EgressFence, c.PrivateNetwork, c.Endpoint = "nftables", true, "unix:///run/gw.sock"
		}, "OPENSHELL_EGRESS_FENCE is for a supervisor sharing the agent's network namespace; it cannot be combined with OPENSHELL_PRIVATE_NETWORK, OPENSHELL_EGRESS_DIALER_FD or OPENSHELL_EGRESS_DIALER_PATH"},
		{"with a host dialer", func(c *Config) { c.EgressFence, c.EgressDialerFD = "nftables", 3 },
			"OPENSHELL_EGRESS_FENCE is for a supervisor sharing the agent's network namespace; it cannot be combined with OPENSHELL_PRIVATE_NETWORK, OPENSHELL_EGRESS_DIALER_FD or OPENSHELL_EGRESS_DIALER_PATH"},
		{"with a host dialer socket", func(c *Config) { c.EgressFence, c.EgressDialerPath = "nftables", "/run/openshell/egress/dialer.sock" },
			"OPENSHELL_EGRESS_FENCE is for a supervisor sharing the agent's network namespace; it cannot be combined with OPENSHELL_PRIVATE_NETWORK, OPENSHELL_EGRESS_DIALER_FD or OPENSHELL_EGRESS_DIALER_PATH"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mod(&c)
			got := ""
			if err := c.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate() = %q, want %q", got, tt.want)
			}
		})
	}
	c, err := ConfigFromEnv(func(k string) string {
		return map[string]string{EnvEndpoint: "https://gw:8443", EnvSandboxID: "sb", EnvEgressFence: "nftables"}[k]
	})
	if err != nil || c.EgressFence != "nftables" {
		t.Errorf("ConfigFromEnv(%s=nftables) = %q, %v", EnvEgressFence, c.EgressFence, err)
	}
}

// TestConfigEgressDialerPath: OPENSHELL_EGRESS_DIALER_PATH (Docker) names
// the host dialer socket by a clean absolute path and excludes an
// inherited dialer descriptor.
func TestConfigEgressDialerPath(t *testing.T) {
	load := func(env map[string]string) (Config, error) {
		env[EnvEndpoint], env[EnvSandboxID] = "unix:///run/openshell/gateway/gateway.sock", "sb"
		return ConfigFromEnv(func(k string) string { return env[k] })
	}
	c, err := load(map[string]string{EnvEgressDialerPath: "/run/openshell/egress/dialer.sock", EnvPrivateNetwork: "true"})
	if err != nil || c.EgressDialerPath != "/run/openshell/egress/dialer.sock" {
		t.Errorf("ConfigFromEnv(%s) = %q, %v", EnvEgressDialerPath, c.EgressDialerPath, err)
	}
	for _, bad := range []map[string]string{
		{EnvEgressDialerPath: "dialer.sock"},
		{EnvEgressDialerPath: "/run/../dialer.sock"},
		{EnvEgressDialerPath: "/run/dialer.sock", EnvEgressDialerFD: "3"},
	} {
		if _, err := load(bad); err == nil || !strings.Contains(err.Error(), EnvEgressDialerPath) {
			t.Errorf("ConfigFromEnv(%v) = %v, want an error naming %s", bad, err, EnvEgressDialerPath)
		}
	}
}

// TestGatewayAddrs: in a pod the gateway is a TCP endpoint, and its
// addresses are denied by the proxy's SSRF guard.
func TestGatewayAddrs(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	for _, tt := range []struct {
		endpoint string
		want     []netip.Prefix
	}{
		{"https://10.96.0.12:17670", []netip.Prefix{netip.MustParsePrefix("10.96.0.12/32")}},
		{"http://[fd00::1]:17670", []netip.Prefix{netip.MustParsePrefix("fd00::1/128")}},
		{"unix:///run/openshell/gw.sock", nil},
	} {
		if got := gatewayAddrs(t.Context(), log, tt.endpoint); !slices.Equal(got, tt.want) {
			t.Errorf("gatewayAddrs(%q) = %v, want %v", tt.endpoint, got, tt.want)
		}
	}
	if got := gatewayAddrs(t.Context(), log, "https://localhost:17670"); !slices.Contains(got, netip.MustParsePrefix("127.0.0.1/32")) {
		t.Errorf("gatewayAddrs(localhost) = %v, want 127.0.0.1/32 among them", got)
	}
}

// TestFenceModeResolver: in fence mode the proxy and the inference router
// resolve names with the system resolver; a nil resolver made the router
// panic on an upstream named by host name.
func TestFenceModeResolver(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	r, err := egressResolver(log, Config{EgressFence: "nftables"}, nil)
	if err != nil || r == nil {
		t.Fatalf("egressResolver(fence mode) = %v, %v; want the system resolver", r, err)
	}
	addrs, err := r.LookupNetIP(t.Context(), "ip", "localhost")
	for i := range addrs {
		addrs[i] = addrs[i].Unmap() // the Go resolver may answer IPv4 in IPv6 form
	}
	if err != nil || !slices.Contains(addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("LookupNetIP(localhost) = %v, %v; want 127.0.0.1 among them", addrs, err)
	}
}
