package retention

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	deleted, errors, runs prometheus.Counter
	lastRun               prometheus.Gauge
}

// newMetrics keeps the name cdcrelay_janitor_deleted_total, which retention
// had when it ran inside the janitor, so dashboards and alerts go on working.
// The run metrics, which the chart's CdcrelayRetentionFailing groups by
// source, carry the relay's slot as a constant label.
func newMetrics(reg prometheus.Registerer, slot string) *metrics {
	bySlot := prometheus.Labels{"slot": slot}
	m := &metrics{
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_janitor_deleted_total", Help: "Published outbox rows deleted by retention.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_retention_errors_total", Help: "Retention runs that failed (retried at the next interval; streaming and marking go on).",
			ConstLabels: bySlot,
		}),
		runs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_retention_runs_total", Help: "Retention runs completed.",
			ConstLabels: bySlot,
		}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_retention_last_success_timestamp_seconds", Help: "Unix time the last retention run completed (0: none yet).",
			ConstLabels: bySlot,
		}),
	}
	reg.MustRegister(m.deleted, m.errors, m.runs, m.lastRun)
	return m
}
