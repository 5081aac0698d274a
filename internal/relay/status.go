package relay

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/janitor"
)

// Reason names, from a small fixed set, why the relay is in the state
// Status describes: cdcrelay_status carries it as a label, so a dashboard
// and an alert can tell "needs an operator" from "retrying" without
// parsing /readyz's body.
type Reason string

// The reasons, in the order Status explains them.
const (
	ReasonOK            Reason = "ok"             // streaming, or a standby waiting for the slot, with nothing to report
	ReasonConnecting    Reason = "connecting"     // starting a session, nothing known to wait for yet
	ReasonCreatingSlot  Reason = "creating_slot"  // slot creation waits: open transactions, a running-xacts record, the standby's replay
	ReasonRetrying      Reason = "retrying"       // backing off after a failed session that may heal by itself
	ReasonNeedsOperator Reason = "needs_operator" // backing off after a failure only an operator can fix (OperatorError)
	ReasonBrokerBlocked Reason = "broker_blocked" // the broker blocks publishers (a resource alarm)
	ReasonMarksFailing  Reason = "marks_failing"  // streaming, but the marks fail: the slot cannot advance
	ReasonMarksWaiting  Reason = "marks_waiting"  // streaming, but the marks wait for a standby: the slot cannot advance
	ReasonSlotForeign   Reason = "slot_foreign"   // a process that is not a relay holds the slot (slotholder.go)
)

// allReasons lists every Reason, so that each has its series from the start.
func allReasons() []Reason {
	return []Reason{ReasonOK, ReasonConnecting, ReasonCreatingSlot, ReasonRetrying, ReasonNeedsOperator,
		ReasonBrokerBlocked, ReasonMarksFailing, ReasonMarksWaiting, ReasonSlotForeign}
}

// detail is what the relay waits for beyond its role: the reason and the
// sentence /readyz shows.
type detail struct {
	reason Reason
	text   string
}

// setDetail records what the relay waits for, and why.
func (r *Relay) setDetail(reason Reason, text string) {
	r.detail.Store(&detail{reason: reason, text: text})
}

// clearDetail says the relay waits for nothing beyond its role.
func (r *Relay) clearDetail() { r.detail.Store(nil) }

// Reason is the one Reason that describes the relay now. A degraded
// streaming relay reports its marks before a blocked broker: only the
// marks keep WAL from being released.
func (r *Relay) Reason() Reason {
	if r.Role() == RoleStreaming {
		if _, err := r.marksTrouble(); err != nil {
			if errors.As(err, new(*janitor.WaitError)) {
				return ReasonMarksWaiting
			}
			return ReasonMarksFailing
		}
	}
	if d := r.detail.Load(); d != nil {
		return d.reason
	}
	if r.Role() == RoleStarting {
		return ReasonConnecting
	}
	return ReasonOK
}

// marksTrouble returns the marks' error and since when, when they have
// failed, or waited for a standby (a janitor.WaitError), for
// degradedAfter or longer; a nil error otherwise.
func (r *Relay) marksTrouble() (since time.Time, err error) {
	since, err = r.marks.Failing()
	if since.IsZero() || time.Since(since) < degradedAfter || err == nil {
		return time.Time{}, nil
	}
	return since, err
}

// registerStatus exports Reason as cdcrelay_status{reason}: 1 for the
// current reason, 0 for the others, read at each scrape.
func registerStatus(reg prometheus.Registerer, slotName string, r *Relay) {
	for _, reason := range allReasons() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "cdcrelay_status",
			Help:        "1 for the reason behind the relay's state now (what /readyz explains), 0 for the others: ok, connecting, creating_slot, retrying, needs_operator, broker_blocked, marks_failing, marks_waiting, slot_foreign.",
			ConstLabels: prometheus.Labels{"slot": slotName, "reason": string(reason)},
		}, func() float64 {
			if r.Reason() == reason {
				return 1
			}
			return 0
		}))
	}
}
