package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
)

// Raw is the same-run baseline for Bench: the store's statements issued
// directly on the store's own connection pool, without protobuf or
// metadata handling.
type Raw struct {
	// Update runs the CAS UPDATE of object (sandbox, id) from rv to rv+1.
	Update func(ctx context.Context, id string, rv uint64, payload []byte, labelsJSON string) error
	// Get reads payload and resource_version of (sandbox, id).
	Get func(ctx context.Context, id string) error
	// ListTeamProd lists workspace "bench" objects labelled
	// team=t3,env=prod in store order, limit 100, and returns the count.
	ListTeamProd func(ctx context.Context) (int, error)
}

// Bench runs the store benchmarks against s and the raw baseline. Each
// iteration runs the store operation and its raw statement once, timed
// separately; the reported ratio is store throughput / raw throughput.
func Bench(b *testing.B, newStore func(b *testing.B) (store.Store, Raw)) {
	b.Run("CASUpdate", func(b *testing.B) {
		s, raw := newStore(b)
		ctx := b.Context()
		sb := Sandbox("bench-cas", "bench", "cas", map[string]string{"team": "t1"})
		rawSB := Sandbox("bench-raw", "bench", "raw", map[string]string{"team": "t1"})
		for _, m := range []*openshellv1.Sandbox{sb, rawSB} {
			if _, err := s.Create(ctx, store.TypeSandbox, m); err != nil {
				b.Fatal(err)
			}
		}
		payload, err := proto.Marshal(rawSB)
		if err != nil {
			b.Fatal(err)
		}
		rawRV := uint64(1)
		var storeDur, rawDur time.Duration
		i := 0
		for b.Loop() {
			i++
			storeDur += timed(i%2 == 0, func() {
				sb.Status.CurrentPolicyVersion++
				if _, err := s.Update(ctx, store.TypeSandbox, sb, 0); err != nil {
					b.Fatal(err)
				}
			}, &rawDur, func() {
				if err := raw.Update(ctx, "bench-raw", rawRV, payload, `{"team":"t1"}`); err != nil {
					b.Fatal(err)
				}
				rawRV++
			})
		}
		report(b, storeDur, rawDur)
	})
	b.Run("Get", func(b *testing.B) {
		s, raw := newStore(b)
		ctx := b.Context()
		if _, err := s.Create(ctx, store.TypeSandbox, Sandbox("bench-get", "bench", "get", map[string]string{"team": "t1"})); err != nil {
			b.Fatal(err)
		}
		msg := &openshellv1.Sandbox{}
		var storeDur, rawDur time.Duration
		i := 0
		for b.Loop() {
			i++
			storeDur += timed(i%2 == 0, func() {
				if err := s.Get(ctx, store.TypeSandbox, "bench-get", msg); err != nil {
					b.Fatal(err)
				}
			}, &rawDur, func() {
				if err := raw.Get(ctx, "bench-get"); err != nil {
					b.Fatal(err)
				}
			})
		}
		report(b, storeDur, rawDur)
	})
	b.Run("ListSelector10k", func(b *testing.B) {
		s, raw := newStore(b)
		ctx := b.Context()
		const n = 10000
		for i := range n {
			env := "dev"
			if i%2 == 0 {
				env = "prod"
			}
			sb := Sandbox(fmt.Sprintf("bench-%05d", i), "bench", fmt.Sprintf("sb-%05d", i),
				map[string]string{"team": fmt.Sprintf("t%d", i%10), "env": env, "idx": fmt.Sprint(i)})
			if _, err := s.Create(ctx, store.TypeSandbox, sb); err != nil {
				b.Fatal(err)
			}
		}
		opts := store.ListOptions{Workspace: "bench", LabelSelector: "team=t4,env=prod", Limit: 100}
		var storeLat, rawLat []time.Duration
		i := 0
		for b.Loop() {
			i++
			var rawD time.Duration
			storeD := timed(i%2 == 0, func() {
				got, err := store.ListAs(ctx, s, store.TypeSandbox, opts, func() *openshellv1.Sandbox { return &openshellv1.Sandbox{} })
				if err != nil || len(got) != 100 {
					b.Fatalf("ListAs = %d items, %v; want 100", len(got), err)
				}
			}, &rawD, func() {
				if c, err := raw.ListTeamProd(ctx); err != nil || c != 100 {
					b.Fatalf("raw list = %d, %v; want 100", c, err)
				}
			})
			storeLat = append(storeLat, storeD)
			rawLat = append(rawLat, rawD)
		}
		b.ReportMetric(ms(p50(storeLat)), "store-p50-ms")
		b.ReportMetric(ms(p50(rawLat)), "raw-p50-ms")
		b.ReportMetric(float64(p50(rawLat))/float64(p50(storeLat)), "ratio")
	})
}

// timed runs op and baseline (baseline first when baselineFirst, so
// neither side systematically pays for the other's after-effects such as
// WAL checkpoints), adds the baseline's duration to *baselineDur and
// returns op's.
func timed(baselineFirst bool, op func(), baselineDur *time.Duration, baseline func()) time.Duration {
	if baselineFirst {
		t0 := time.Now()
		baseline()
		*baselineDur += time.Since(t0)
	}
	t0 := time.Now()
	op()
	d := time.Since(t0)
	if !baselineFirst {
		t1 := time.Now()
		baseline()
		*baselineDur += time.Since(t1)
	}
	return d
}

func report(b *testing.B, storeDur, rawDur time.Duration) {
	n := float64(b.N)
	b.ReportMetric(n/storeDur.Seconds(), "store-ops/s")
	b.ReportMetric(n/rawDur.Seconds(), "raw-ops/s")
	b.ReportMetric(rawDur.Seconds()/storeDur.Seconds(), "ratio")
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
