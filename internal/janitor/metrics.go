package janitor

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	marked, errors, parked, parkUnrecorded, gone, waits, connects prometheus.Counter
}

// newMetrics registers the janitor's metrics. cdcrelay_marks_failing_seconds,
// which the chart's CdcrelayMarkingFailing groups by source, carries the
// relay's slot as a constant label.
func newMetrics(reg prometheus.Registerer, slot string, failing func() float64) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		marked:         c("cdcrelay_janitor_marked_total", "Outbox rows marked published_at after the broker acknowledged them."),
		errors:         c("cdcrelay_janitor_errors_total", "Janitor connections or statements that failed (retried with backoff; streaming goes on)."),
		parked:         c("cdcrelay_janitor_parked_total", "Poison events recorded on their rows (attempts+1, last_error)."),
		parkUnrecorded: c("cdcrelay_janitor_park_unrecorded_total", "Poison events skipped without a record on their row: the role lacks UPDATE (attempts, last_error) or the table lacks those columns."),
		gone:           c("cdcrelay_janitor_rows_gone_total", "Acked events whose rows a flush could not find although their transactions were visible: counted as deleted, so the slot may pass them."),
		waits:          c("cdcrelay_janitor_backpressure_waits_total", "Times an ack waited for room among the unwritten marks (the publisher pauses meanwhile)."),
		connects:       c("cdcrelay_janitor_connects_total", "Janitor connection attempts (made only when there is work, with backoff after failures)."),
	}
	reg.MustRegister(m.marked, m.errors, m.parked, m.parkUnrecorded, m.gone, m.waits, m.connects,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cdcrelay_marks_failing_seconds",
			Help:        "How long the janitor's writes have failed without a success in between, or written marks have waited more than 5 s for a standby the slot needs them on (0 otherwise): the slot cannot pass those events meanwhile.",
			ConstLabels: prometheus.Labels{"slot": slot}},
			failing))
	return m
}
