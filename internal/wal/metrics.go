package wal

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the replication stream's metrics. One value serves every
// session of a process.
type Metrics struct {
	decoded   prometheus.Counter
	commits   prometheus.Counter
	confirmed prometheus.Gauge
}

// NewMetrics registers the stream's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decoded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_events_decoded_total",
			Help: "Outbox rows decoded from the replication stream (including rows streamed again after a restart).",
		}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_transactions_decoded_total",
			Help: "Transactions decoded from the replication stream.",
		}),
		confirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_confirmed_lsn",
			Help: "Last position reported to PostgreSQL as flushed (the slot's confirmed position), as a number.",
		}),
	}
	reg.MustRegister(m.decoded, m.commits, m.confirmed)
	return m
}
