package monitor

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	pending, oldest, retained, lag, safeWAL prometheus.Gauge
	walStatus                               *prometheus.GaugeVec
	errors                                  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, slot string) *metrics {
	labels := prometheus.Labels{"slot": slot}
	m := &metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_outbox_unpublished", Help: "Outbox rows with published_at IS NULL.", ConstLabels: labels,
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_oldest_unpublished_age_seconds", Help: "Age of the oldest outbox row with published_at IS NULL (0 when none; NaN when the table has no enqueued_at column).", ConstLabels: labels,
		}),
		retained: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_slot_retained_wal_bytes", Help: "WAL the slot makes PostgreSQL keep: current WAL position minus restart_lsn.", ConstLabels: labels,
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_slot_lag_bytes", Help: "Current WAL position minus the slot's confirmed_flush_lsn.", ConstLabels: labels,
		}),
		safeWAL: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_slot_safe_wal_size_bytes", Help: "WAL that can still be written before the slot is invalidated (-1: max_slot_wal_keep_size unlimited).", ConstLabels: labels,
		}),
		walStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdcrelay_slot_wal_status", Help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost).", ConstLabels: labels,
		}, []string{"status"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_monitor_errors_total", Help: "Backlog and slot health queries that failed.", ConstLabels: labels,
		}),
	}
	reg.MustRegister(m.pending, m.oldest, m.retained, m.lag, m.safeWAL, m.walStatus, m.errors)
	return m
}
