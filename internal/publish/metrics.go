package publish

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the publisher's metrics. One value serves every session.
type Metrics struct {
	published      prometheus.Counter
	bytes          prometheus.Counter
	inFlight       prometheus.Gauge
	nacks          prometheus.Counter
	returns        prometheus.Counter
	blocked        prometheus.Gauge
	poison         prometheus.Counter
	lastConfirm    prometheus.Gauge
	confirmLatency prometheus.Histogram
	commitToAck    prometheus.Histogram
	resumed        prometheus.Counter
	stalled        *prometheus.GaugeVec
	deadLetter     *prometheus.CounterVec
	brokerLimit    prometheus.Gauge
}

// NewMetrics registers the publisher's metrics with reg. The metrics the
// chart's alerts group by source carry the relay's slot as a constant label
// (slot), like the monitor's and the role: an alert on them names its slot.
func NewMetrics(reg prometheus.Registerer, slot string) *Metrics {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	bySlot := prometheus.Labels{"slot": slot}
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_events_published_total", Help: "Messages published to the broker (including republished ones).",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_published_bytes_total", Help: "Message body bytes published to the broker.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_confirms_in_flight", Help: "Messages published and not yet confirmed by the broker.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_nacks_total", Help: "Messages the broker nacked; each one restarts the pipeline.",
			ConstLabels: bySlot,
		}),
		returns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_returns_total", Help: "Messages the broker returned as unroutable; each one restarts the pipeline.",
		}),
		poison: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_poison_events_total", Help: "Events that can never become a valid message (NULL routing key, invalid JSON, too large, ...).",
			ConstLabels: bySlot,
		}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_broker_blocked", Help: "1 while the broker blocks publishers (resource alarm).",
			ConstLabels: bySlot,
		}),
		lastConfirm: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_last_confirm_timestamp_seconds", Help: "Unix time the broker last confirmed a published message (0: none since start).",
		}),
		confirmLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cdcrelay_confirm_latency_seconds", Help: "Time from publish to broker confirm.", Buckets: buckets,
		}),
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cdcrelay_commit_to_ack_seconds", Help: "Time from the PostgreSQL commit to the broker confirm.", Buckets: buckets,
			ConstLabels: bySlot,
		}),
		resumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_resumed_events_total", Help: "Events not published again because an earlier session had them acknowledged and marked (a session that ended inside a transaction).",
		}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdcrelay_stalled_event_info", Help: "1 while the stream is stalled on this row: the broker cannot route it and CDCRELAY_UNROUTABLE=stall (cause no_route: no binding; no_exchange: the row's exchange does not exist).",
			ConstLabels: bySlot,
		}, []string{"id", "exchange", "routing_key", "cause"}),
		deadLetter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cdcrelay_dead_letter_failures_total", Help: "Dead-letter copies of parked rows the broker did not take (returned, nacked, or refused by closing the channel); the rows are parked all the same.",
			ConstLabels: bySlot,
		}, []string{"outcome"}),
		brokerLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cdcrelay_broker_max_message_bytes", Help: "The broker's max_message_size, learned from a refusal; 0 until known, and again once the broker accepts a larger message.",
		}),
	}
	for _, o := range []string{"returned", "nacked", "refused"} {
		m.deadLetter.WithLabelValues(o)
	}
	reg.MustRegister(m.resumed, m.stalled, m.deadLetter, m.brokerLimit)
	reg.MustRegister(m.published, m.bytes, m.inFlight, m.nacks, m.returns, m.blocked, m.poison, m.lastConfirm, m.confirmLatency, m.commitToAck)
	return m
}
