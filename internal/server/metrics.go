package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"
)

// metrics holds the gateway's Prometheus collectors on a dedicated registry.
type metrics struct {
	reg      *prometheus.Registry
	handled  *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		reg: reg,
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "openshell_grpc_server_handled_total",
			Help: "RPCs completed by the gateway, by method and status code.",
		}, []string{"grpc_method", "grpc_code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "openshell_grpc_server_handling_seconds",
			Help:    "Latency of RPCs by method and status code (unary: until the response; streams: until the stream ends).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"grpc_method", "grpc_code"}),
	}
	for _, c := range []prometheus.Collector{
		m.handled, m.duration,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(method string, code codes.Code, d time.Duration) {
	m.handled.WithLabelValues(method, code.String()).Inc()
	m.duration.WithLabelValues(method, code.String()).Observe(d.Seconds())
}
