package gatewaytest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
)

// TestConcurrentGlobalConfigWriters: two gateway processes on one
// PostgreSQL database, two goroutines on each, write the global settings
// and the global policy through UpdateConfig at once. No update is lost:
// every settings write is one settings revision and every writer's last
// value is in force on both gateways; every global policy write is its own
// revision and exactly the newest is in force.
func TestConcurrentGlobalConfigWriters(t *testing.T) {
	db := postgrestest.NewDatabase(t)
	gws := []*Gateway{Start(t, Options{ExtraArgs: []string{"--db-url", db}}), Start(t, Options{ExtraArgs: []string{"--db-url", db}})}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	keys := []string{"providers_v2_enabled", "ocsf_json_enabled", "agent_policy_proposals_enabled", "proposal_approval_mode"}
	value := func(key string, v int) *sandboxv1.SettingValue {
		if key == "proposal_approval_mode" {
			return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: []string{"manual", "auto"}[v%2]}}
		}
		return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: v%2 == 0}}
	}
	// retry is the client's answer to Aborted (the gateway already retried
	// a few times on a fresh read).
	retry := func(do func() error) error {
		for {
			err := do()
			if status.Code(err) != codes.Aborted {
				return err
			}
		}
	}
	const n = 8
	var wg sync.WaitGroup
	for w, key := range keys {
		c := gws[w%2].Client()
		wg.Go(func() {
			for v := range n {
				err := retry(func() error {
					_, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: key, SettingValue: value(key, v)})
					return err
				})
				if err != nil {
					t.Errorf("UpdateConfig(%s, round %d): %v", key, v, err)
					return
				}
				err = retry(func() error {
					_, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, Policy: &sandboxv1.SandboxPolicy{Version: 1,
						NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"r": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: fmt.Sprintf("w%d-%d.example.com", w, v), Port: 443}}}}}})
					return err
				})
				if err != nil {
					t.Errorf("UpdateConfig(global policy, writer %d round %d): %v", w, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, g := range gws {
		cfg, err := g.Client().GetGatewayConfig(ctx, &sandboxv1.GetGatewayConfigRequest{})
		if err != nil {
			t.Fatalf("gateway %d: GetGatewayConfig: %v", i, err)
		}
		if cfg.GetSettingsRevision() != uint64(len(keys)*n) {
			t.Errorf("gateway %d: settings_revision = %d, want %d (one per write)", i, cfg.GetSettingsRevision(), len(keys)*n)
		}
		for _, key := range keys {
			if got, want := cfg.GetSettings()[key], value(key, n-1); got.String() != want.String() {
				t.Errorf("gateway %d: %s = %v, want the last write %v", i, key, got, want)
			}
		}
		revs, err := g.Client().ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Global: true, Limit: 100})
		if err != nil {
			t.Fatalf("gateway %d: ListSandboxPolicies(global): %v", i, err)
		}
		loaded := 0
		for j, r := range revs.GetRevisions() {
			if r.GetVersion() != uint32(len(revs.GetRevisions())-j) {
				t.Errorf("gateway %d: revision %d has version %d", i, j, r.GetVersion())
			}
			if r.GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
				loaded++
			}
		}
		if len(revs.GetRevisions()) != len(keys)*n || loaded != 1 || revs.GetRevisions()[0].GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
			t.Errorf("gateway %d: %d global revisions, %d LOADED; want %d, only the newest", i, len(revs.GetRevisions()), loaded, len(keys)*n)
		}
	}
}
