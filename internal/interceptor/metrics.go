package interceptor

import "github.com/prometheus/client_golang/prometheus"

// Registerer is where the metrics go (a *prometheus.Registry).
type Registerer = prometheus.Registerer

type metrics struct {
	evaluations        *prometheus.CounterVec
	failOpen           *prometheus.CounterVec
	postCommitFailures *prometheus.CounterVec
}

func newMetrics(reg Registerer) (*metrics, error) {
	m := &metrics{
		evaluations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_gateway_interceptor_evaluations_total",
			Help: "Interceptor evaluations by interceptor, binding, phase and outcome (allow, deny, error).",
		}, []string{"interceptor", "binding", "phase", "outcome"}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_gateway_interceptor_fail_open_total",
			Help: "Failed interceptor evaluations that a fail_open binding let through.",
		}, []string{"interceptor", "binding", "phase"}),
		postCommitFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_gateway_interceptor_post_commit_observation_failures_total",
			Help: "Post-commit observations that failed; the committed response was returned unchanged.",
		}, []string{"interceptor", "binding"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.evaluations, m.failOpen, m.postCommitFailures} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
