package relay

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	restarts   prometheus.Counter
	reconnects *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_pipeline_restarts_total", Help: "Sessions that failed and were restarted from the slot.",
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cdcrelay_connect_failures_total", Help: "Failed connection attempts, by side (postgres or broker).",
		}, []string{"side"}),
	}
	reg.MustRegister(m.restarts, m.reconnects)
	return m
}
