package inbox

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the inbox's counters, by handler name.
type metrics struct {
	handled    *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	takenOver  *prometheus.CounterVec
	errors     *prometheus.CounterVec
	late       *prometheus.CounterVec
	purged     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	byHandler := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"handler"})
	}
	m := &metrics{
		handled:    byHandler("cdcrelay_inbox_handled_total", "Deliveries whose handler ran and whose claim is done."),
		duplicates: byHandler("cdcrelay_inbox_duplicates_total", "Deliveries acked without running the handler: their claim was already done."),
		takenOver:  byHandler("cdcrelay_inbox_claims_taken_over_total", "HandleEffect claims taken over after another consumer's lease expired."),
		errors:     byHandler("cdcrelay_inbox_handler_errors_total", "Handler failures (the delivery nacked)."),
		late:       byHandler("cdcrelay_inbox_late_events_total", "Events handled after a greater (commit LSN, index) of their routing key."),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_inbox_purged_rows_total", Help: "Done ledger rows deleted by retention.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.handled, m.duplicates, m.takenOver, m.errors, m.late, m.purged} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("inbox: metrics already registered (one Inbox per registry): %w", err)
			}
			return nil, fmt.Errorf("inbox: register metrics: %w", err)
		}
	}
	return m, nil
}
