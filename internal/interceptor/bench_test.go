package interceptor

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
)

// BenchmarkOneInterceptor calls CreateProvider on two servers in the same
// loop: one whose plan has a single validate binding of a no-op interceptor
// process (loopback gRPC), one without interceptors. It reports the p50 of
// each, the added p50, the ratio of the means and, as the floor of the
// added cost, the p50 of a bare gRPC round trip to the interceptor process.
func BenchmarkOneInterceptor(b *testing.B) {
	f := startFake(b, manifest("", bind("noop", rpcCreateProvider, "", Validate)), "noop", "")
	c := Config{Name: "noop", Endpoint: f.endpoint, AllowInsecureTransport: true, BindingPolicy: Dynamic,
		Timeout: 2 * time.Second, MaxResponseBytes: DefaultMaxResponseBytes, MaxPatches: DefaultMaxPatches}
	rt, err := Start(b.Context(), Options{Configs: []Config{c}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rt.Close)
	with, _, _ := serve(b, rt)
	without, _, _ := serve(b, nil)
	req := providerReq()
	// The floor: one bare gRPC round trip to the same interceptor process.
	conn, err := dial(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	raw := gipb.NewGatewayInterceptorClient(conn)
	var on, off, bare []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := without.CreateProvider(b.Context(), req); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := with.CreateProvider(b.Context(), req); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := raw.Describe(b.Context(), &gipb.DescribeRequest{}); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(t2))
		on = append(on, t2.Sub(t1))
		off = append(off, t1.Sub(t0))
	}
	p50 := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	var sumOn, sumOff time.Duration
	for i := range on {
		sumOn, sumOff = sumOn+on[i], sumOff+off[i]
	}
	b.ReportMetric(float64(p50(on).Nanoseconds()), "intercepted-p50-ns")
	b.ReportMetric(float64(p50(off).Nanoseconds()), "plain-p50-ns")
	b.ReportMetric(float64((p50(on) - p50(off)).Nanoseconds()), "added-p50-ns")
	b.ReportMetric(float64(p50(bare).Nanoseconds()), "interceptor-rtt-p50-ns")
	b.ReportMetric(float64(sumOn)/float64(sumOff), "ratio")
}
