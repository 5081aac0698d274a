package wal

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the replication stream's metrics. One value serves every
// session of a process.
type Metrics struct {
	decoded prometheus.Counter
	// lastEvent is when an outbox row was last decoded: with the
	// publisher's last confirm, the "time since" an on-call person asks
	// for first.
	lastEvent prometheus.Gauge
	commits   prometheus.Counter
	confirmed prometheus.Gauge
	// statuses counts standby status updates sent; the walsender reads and
	// processes each one, so it is a cost of the relay on the primary.
	statuses prometheus.Counter
	// keepalives counts the server's keepalive messages received.
	keepalives prometheus.Counter
	// foreignSkipped counts inserts from foreign relations of the
	// publication, skipped. No relation label: the warning names each one,
	// and a publication may hold any number of tables.
	foreignSkipped prometheus.Counter
}

// NewMetrics registers the stream's metrics with reg. foreignSkipped, which
// an alert of the chart groups by source, carries the relay's slot as a
// constant label.
func NewMetrics(reg prometheus.Registerer, slot string) *Metrics {
	m := &Metrics{
		decoded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_events_decoded_total",
			Help: "Outbox rows decoded from the replication stream (including rows streamed again after a restart).",
		}),
		lastEvent: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_last_event_timestamp_seconds",
			Help: "Unix time an outbox row was last decoded from the replication stream (0: none since start).",
		}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_transactions_decoded_total",
			Help: "Transactions decoded from the replication stream.",
		}),
		confirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_confirmed_lsn",
			Help: "Last position reported to PostgreSQL as flushed (the slot's confirmed position), as a number.",
		}),
		statuses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_status_updates_total",
			Help: "Standby status updates sent to PostgreSQL (position reports and keepalive replies).",
		}),
		keepalives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_keepalives_received_total",
			Help: "Keepalive messages received from PostgreSQL's walsender.",
		}),
		foreignSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "cdcrelay_foreign_inserts_skipped_total",
			Help:        "Inserts from tables of the relay's publication that are provably not the outbox, skipped (including rows streamed again after a restart).",
			ConstLabels: prometheus.Labels{"slot": slot},
		}),
	}
	reg.MustRegister(m.decoded, m.lastEvent, m.commits, m.confirmed, m.statuses, m.keepalives, m.foreignSkipped)
	return m
}
