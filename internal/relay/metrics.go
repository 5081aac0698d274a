package relay

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	restarts        prometheus.Counter
	connectFailures *prometheus.CounterVec
	reconnects      *prometheus.CounterVec
	connected       map[string]bool // sides connected at least once; touched by the Run goroutine only
	slotLost        prometheus.Counter
	backfilled      prometheus.Counter
	// backfilling is 1 while a new slot's backlog is published.
	backfilling prometheus.Gauge
	// lockHeld is 1 while this relay holds the slot lock: creating the
	// slot, publishing its backlog or streaming.
	lockHeld prometheus.Gauge
	// backfillRows is how many rows the last backfill set out to publish,
	// backfillDone how many of them are confirmed.
	backfillRows, backfillDone prometheus.Gauge
	role                       *prometheus.GaugeVec
	timeline                   prometheus.Gauge

	// brokerNodeSwitches counts sessions on another broker node than the
	// session before (CDCRELAY_AMQP_URL lists several).
	brokerNodeSwitches prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, slotName string) *metrics {
	m := &metrics{
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_pipeline_restarts_total", Help: "Sessions that failed and were restarted from the slot.",
			// The chart's CdcrelayRestartStorm groups by source and slot.
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		connectFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cdcrelay_connect_failures_total", Help: "Failed connection attempts, by side (postgres or broker).",
		}, []string{"side"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cdcrelay_reconnects_total", Help: "Connections opened again after the first, by side (postgres replication or broker).",
		}, []string{"side"}),
		brokerNodeSwitches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_broker_node_switches_total",
			Help: "Broker connections made to another node than the previous one (CDCRELAY_AMQP_URL lists several nodes; each session after a failure starts with the next).",
		}),
		connected: map[string]bool{},
		slotLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_slot_lost_total", Help: "Times the slot was found invalidated (wal_status=lost).",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		backfilled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_backfill_events_total", Help: "Events published from a new slot's snapshot (adoption or recreation).",
			// The slot label lets an alert on one slot see its adoption
			// progressing (CdcrelayNoStreamingRelay holds off meanwhile).
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		backfillRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_backfill_rows", Help: "Rows the last backfill of this relay set out to publish, counted in its snapshot when it began (0: none since start); cdcrelay_backfill_events_total counts them as they are confirmed.",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		backfillDone: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_backfill_rows_done", Help: "Rows of the last backfill (cdcrelay_backfill_rows) the broker has confirmed; with cdcrelay_backfill_running, the adoption's progress and ETA.",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		backfilling: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_backfill_running", Help: "1 while this relay publishes a new slot's backlog from its snapshot (adoption or recreation); with cdcrelay_backfill_events_total and cdcrelay_outbox_unpublished, the progress and what is left.",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		lockHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_slot_lock_held", Help: "1 while this relay holds the slot lock: it is the one replica working on the slot, creating it, publishing its backlog or streaming (cdcrelay_role says streaming only for the last).",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		timeline: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "cdcrelay_postgres_timeline",
			Help:        "Timeline of the PostgreSQL server the replication connection reached last; it changes when a standby is promoted.",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}),
		role: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "cdcrelay_role",
			Help:        "1 for the role this relay has now: streaming (holds the slot), standby (waits for it) or starting.",
			ConstLabels: prometheus.Labels{"slot": slotName},
		}, []string{"role"}),
	}
	for _, r := range []Role{RoleStarting, RoleStreaming, RoleStandby} {
		m.role.WithLabelValues(r.String()).Set(0)
	}
	m.role.WithLabelValues(RoleStarting.String()).Set(1)
	for _, side := range []string{"postgres", "broker"} {
		m.connectFailures.WithLabelValues(side)
		m.reconnects.WithLabelValues(side)
	}
	reg.MustRegister(m.restarts, m.connectFailures, m.reconnects, m.brokerNodeSwitches, m.slotLost, m.backfilled, m.backfilling, m.backfillRows, m.backfillDone, m.lockHeld, m.role, m.timeline)
	return m
}

// registerLimits exports the in-flight limits the relay runs with, so a
// dashboard can set what is in flight against them.
func registerLimits(reg prometheus.Registerer, events, bytes int64) {
	gauge := func(name, help string, v int64) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(float64(v))
		return g
	}
	reg.MustRegister(
		gauge("cdcrelay_max_in_flight_events", "CDCRELAY_MAX_IN_FLIGHT: the most messages published and not yet confirmed (cdcrelay_confirms_in_flight).", events),
		gauge("cdcrelay_max_in_flight_bytes", "CDCRELAY_MAX_IN_FLIGHT_BYTES: the most bytes of events between the WAL and the broker's confirm.", bytes))
}

func (m *metrics) setRole(role Role) {
	for _, r := range []Role{RoleStarting, RoleStreaming, RoleStandby} {
		v := 0.0
		if r == role {
			v = 1
		}
		m.role.WithLabelValues(r.String()).Set(v)
	}
}

// connectedTo counts a successful connection to side; every one after the
// first is a reconnect.
func (m *metrics) connectedTo(side string) {
	if m.connected[side] {
		m.reconnects.WithLabelValues(side).Inc()
	}
	m.connected[side] = true
}
