package egress

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxPolicyLabels bounds the policy label of the decision counter: policy
// names come from the sandbox's policy versions, and reloads could bring
// new ones for the life of the supervisor. Names beyond the bound are
// counted under "_other".
const maxPolicyLabels = 256

// Metrics counts the proxy's decisions for Prometheus. Its methods are
// safe for concurrent use.
type Metrics struct {
	decisions *prometheus.CounterVec
	identify  prometheus.Histogram

	mu       sync.Mutex
	policies map[string]struct{} // policy label values in use
}

// NewMetrics registers the proxy's collectors on reg:
// openshell_sandbox_egress_decisions_total{decision,kind,policy}, where
// decision is allow, audit or deny, kind is connect or http, and policy is
// the network policy rule that matched ("" when none did). Hostnames,
// binaries and addresses are not labels: they are unbounded (they are in
// the decision events). The deny series without a policy start at zero.
// Also openshell_sandbox_egress_identify_seconds, the time caller
// identification takes per client connection.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_sandbox_egress_decisions_total",
			Help: "Egress proxy decisions by decision (allow, audit, deny), kind (connect: a CONNECT tunnel; http: one HTTP request) and matching network policy rule (empty when none matched).",
		}, []string{"decision", "kind", "policy"}),
		identify: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "openshell_sandbox_egress_identify_seconds",
			Help:    "Time to identify the processes holding a proxied client connection (once per connection).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
		policies: map[string]struct{}{},
	}
	for _, c := range []prometheus.Collector{m.decisions, m.identify} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Denials without a matching rule are exported from the start, at
	// zero, so an alert on them sees the series before the first one.
	for _, kind := range []string{"connect", "http"} {
		m.decisions.WithLabelValues("deny", kind, m.policyLabel(""))
	}
	return m, nil
}

func (m *Metrics) count(ev *Event) {
	m.decisions.WithLabelValues(ev.Decision, ev.Kind, m.policyLabel(ev.Policy)).Inc()
}

func (m *Metrics) policyLabel(policy string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.policies[policy]; ok {
		return policy
	}
	if len(m.policies) >= maxPolicyLabels {
		return "_other"
	}
	m.policies[policy] = struct{}{}
	return policy
}
