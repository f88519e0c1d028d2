package egress

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// decisionCounts gathers reg's decision counter as "decision kind policy"
// -> value.
func decisionCounts(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "openshell_sandbox_egress_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out[l["decision"]+" "+l["kind"]+" "+l["policy"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Every decision is counted by decision, kind and policy.
func TestProxyCountsDecisions(t *testing.T) {
	port := upstream(t)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test", "other.test"), Identify: fixedCaller("/usr/bin/curl"), Metrics: m},
		curlRules(port, "127.0.0.1"))
	for range 2 {
		if code, _ := get(t, tp.url, fmt.Sprintf("http://allowed.test:%d/x", port)); code != 200 {
			t.Fatalf("allowed GET = %d", code)
		}
	}
	if code, _ := get(t, tp.url, fmt.Sprintf("http://other.test:%d/x", port)); code != http.StatusForbidden {
		t.Fatalf("other host = %d, want 403", code)
	}
	if code, _ := connect(t, tp.url, fmt.Sprintf("allowed.test:%d", port)); code != 200 {
		t.Fatalf("CONNECT = %d", code)
	}
	want := map[string]float64{"allow connect up": 1, "allow http up": 2, "deny http ": 1, "deny connect ": 0}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var identified uint64
	for _, mf := range mfs {
		if mf.GetName() == "openshell_sandbox_egress_identify_seconds" {
			identified = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if identified != 4 {
		t.Errorf("identification observed %d times, want 4 (one per client connection)", identified)
	}
	if diff := cmp.Diff(want, decisionCounts(t, reg)); diff != "" {
		t.Errorf("decision counts (-want +got):\n%s", diff)
	}
}

// The policy label is bounded: names beyond maxPolicyLabels are counted
// under "_other".
func TestMetricsPolicyLabelBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxPolicyLabels + 10 {
		m.count(&Event{Decision: "allow", Kind: "http", Policy: fmt.Sprintf("p%d", i)})
	}
	m.count(&Event{Decision: "allow", Kind: "http", Policy: "p0"})
	got := decisionCounts(t, reg)
	// The empty policy (the two deny series) holds one of the labels:
	// p0..p254 keep theirs, the 11 others are counted under _other.
	if len(got) != maxPolicyLabels+2 || got["allow http _other"] != 11 || got["allow http p0"] != 2 || got["allow http p254"] != 1 {
		t.Errorf("%d series, _other %v, p0 %v, p254 %v; want %d series, 11, 2, 1", len(got), got["allow http _other"], got["allow http p0"], got["allow http p254"], maxPolicyLabels+2)
	}
}
