package policy_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store/sqlite"
)

func netPolicy(host string) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version: 1,
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"r": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: host, Port: 443}}},
		},
	}
}

func TestGlobalLifecycle(t *testing.T) {
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	g := policy.Global{Store: s}
	ctx := t.Context()
	if _, err := g.Active(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Active(none) = %v, want NotFound", err)
	}
	bad := netPolicy("a.example")
	bad.Filesystem = &sandboxv1.FilesystemPolicy{ReadWrite: []string{"/"}}
	if _, err := g.Set(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Set(unsafe) = %v, want InvalidArgument", err)
	}
	if revs, err := g.List(ctx, 10, 0); err != nil || len(revs) != 0 {
		t.Fatalf("after a refused Set: %v, %v; want no revision", revs, err)
	}
	r1, err := g.Set(ctx, netPolicy("a.example"))
	if err != nil || r1.GetVersion() != 1 || r1.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
		t.Fatalf("Set = %v, %v; want version 1 LOADED", r1, err)
	}
	if again, err := g.Set(ctx, netPolicy("a.example")); err != nil || again.GetVersion() != 1 {
		t.Fatalf("Set(same) = %v, %v; want version 1", again, err)
	}
	if r2, err := g.Set(ctx, netPolicy("b.example")); err != nil || r2.GetVersion() != 2 {
		t.Fatalf("Set(other) = %v, %v; want version 2", r2, err)
	}
	if old, err := g.Get(ctx, 1); err != nil || old.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED {
		t.Fatalf("Get(1) = %v, %v; want SUPERSEDED", old, err)
	}
	if removed, err := g.Remove(ctx); err != nil || !removed {
		t.Fatalf("Remove = %v, %v; want removed", removed, err)
	}
	if _, err := g.Active(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Active(after Remove) = %v, want NotFound", err)
	}
	if removed, err := g.Remove(ctx); err != nil || removed {
		t.Fatalf("Remove(again) = %v, %v; want nothing removed", removed, err)
	}
	if _, err := g.Get(ctx, 9); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get(9) = %v, want NotFound", err)
	}
}

// Two replicas (two handles on one database) setting the global policy at
// once: every Set gets its own version and exactly one revision, the
// newest, is in force afterwards.
func TestGlobalConcurrentSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db.sqlite")
	var gs [2]policy.Global
	for i := range gs {
		s, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		gs[i] = policy.Global{Store: s}
	}
	const n = 10
	var wg sync.WaitGroup
	for i, g := range gs {
		wg.Go(func() {
			for j := range n {
				if _, err := g.Set(t.Context(), netPolicy(fmt.Sprintf("h%d-%d.example", i, j))); err != nil {
					t.Errorf("Set: %v", err)
				}
			}
		})
	}
	wg.Wait()
	revs, err := gs[0].List(t.Context(), 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for i, r := range revs {
		if want := uint32(len(revs) - i); r.GetVersion() != want {
			t.Errorf("revision %d has version %d, want %d", i, r.GetVersion(), want)
		}
		if r.GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
			loaded++
			if i != 0 {
				t.Errorf("version %d is LOADED but is not the newest", r.GetVersion())
			}
		}
	}
	if len(revs) != 2*n || loaded != 1 {
		t.Errorf("%d revisions, %d LOADED; want %d and 1", len(revs), loaded, 2*n)
	}
}
