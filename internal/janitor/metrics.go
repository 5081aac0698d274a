package janitor

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	marked, errors, dropped, parked prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		marked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_janitor_marked_total", Help: "Outbox rows marked published_at after the broker acknowledged them.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_janitor_errors_total", Help: "Janitor statements that failed (retried; streaming goes on).",
		}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_janitor_parked_total", Help: "Poison events recorded on their rows (attempts+1, last_error).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_janitor_marks_dropped_total", Help: "Acked ids dropped unmarked because the database could not be written for too long.",
		}),
	}
	reg.MustRegister(m.marked, m.errors, m.dropped, m.parked)
	return m
}
