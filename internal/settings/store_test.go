package settings_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/settings"
	"github.com/openshell-go/openshell/internal/store/open"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
)

func intValue(i int64) *sandboxv1.SettingValue {
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_IntValue{IntValue: i}}
}

// replicas opens the same database twice, as two gateway processes do:
// two connection pools, two settings.Stores with their own mutex.
func replicas(t *testing.T, url string) (a, b *settings.Store) {
	t.Helper()
	var out [2]*settings.Store
	for i := range out {
		st, err := open.Open(t.Context(), url, nil)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		t.Cleanup(func() { _ = st.Close() })
		out[i] = &settings.Store{Records: st}
	}
	return out[0], out[1]
}

func sqliteURL(t testing.TB) string { return "sqlite:" + t.TempDir() + "/gateway.db" }

// A write based on a revision that is no longer the newest stores nothing
// and is Conflict (gRPC Aborted).
func TestPutIsCompareAndSwap(t *testing.T) {
	a, b := replicas(t, sqliteURL(t))
	ctx := t.Context()
	base, err := a.Get(ctx, settings.GlobalScope)
	if err != nil || base.Revision != 0 {
		t.Fatalf("Get(empty) = %v, %v; want revision 0", base, err)
	}
	if _, err := b.Put(ctx, settings.GlobalScope, base, map[string]*sandboxv1.SettingValue{"x": intValue(1)}); err != nil {
		t.Fatalf("Put(first) = %v", err)
	}
	_, err = a.Put(ctx, settings.GlobalScope, base, map[string]*sandboxv1.SettingValue{"y": intValue(2)})
	if !errors.Is(err, errdefs.ErrConflict) || err.Error() != "settings were modified concurrently; please retry" {
		t.Fatalf("Put(stale base) = %v, want Conflict", err)
	}
	got, err := a.Get(ctx, settings.GlobalScope)
	if err != nil || got.Revision != 1 || len(got.Values) != 1 || got.Values["x"].GetIntValue() != 1 {
		t.Fatalf("after the refused write: %v, %v; want revision 1 with x=1 only", got, err)
	}
}

// Two replicas writing the global settings at once lose no update: every
// successful write is one revision and both writers' last values are in
// force. It runs on SQLite (two handles on one file) and on PostgreSQL
// (two pools on one database).
func TestConcurrentGlobalWritersLoseNothing(t *testing.T) {
	for name, url := range map[string]func(testing.TB) string{
		"sqlite":   sqliteURL,
		"postgres": postgrestest.NewDatabase,
	} {
		t.Run(name, func(t *testing.T) {
			a, b := replicas(t, url(t))
			const n = 25
			var wg sync.WaitGroup
			var writes [2]int
			for i, s := range []*settings.Store{a, b} {
				key := fmt.Sprintf("k%d", i)
				wg.Go(func() {
					for v := range int64(n) {
						for {
							_, changed, err := s.Update(t.Context(), settings.GlobalScope, func(m map[string]*sandboxv1.SettingValue) (bool, error) {
								m[key] = intValue(v)
								return true, nil
							})
							if errors.Is(err, errdefs.ErrConflict) {
								continue // the client's retry on Aborted
							}
							if err != nil || !changed {
								t.Errorf("Update(%s=%d) = %v, %v", key, v, changed, err)
								return
							}
							writes[i]++
							break
						}
					}
				})
			}
			wg.Wait()
			got, err := a.Get(t.Context(), settings.GlobalScope)
			if err != nil {
				t.Fatal(err)
			}
			if got.Revision != uint64(writes[0]+writes[1]) || writes[0] != n || writes[1] != n {
				t.Errorf("revision %d after %v successful writes, want %d", got.Revision, writes, 2*n)
			}
			if got.Values["k0"].GetIntValue() != n-1 || got.Values["k1"].GetIntValue() != n-1 {
				t.Errorf("values = %v, want k0=k1=%d", got.Values, n-1)
			}
		})
	}
}

// Sandbox settings belong to their sandbox: without it the write is
// NotFound.
func TestSandboxScopeNeedsSandbox(t *testing.T) {
	a, _ := replicas(t, sqliteURL(t))
	_, err := a.Put(t.Context(), "no-such-sandbox", settings.Snapshot{}, map[string]*sandboxv1.SettingValue{"x": intValue(1)})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Put(missing sandbox) = %v, want NotFound", err)
	}
}
