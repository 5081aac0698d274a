package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// Status is Role, followed by what the relay waits for when it knows, e.g.
// "starting: creating replication slot … waits for …". /readyz shows it;
// Reason names it from a fixed set (status.go).
func (r *Relay) Status() string {
	s := r.Role().String()
	if d := r.detail.Load(); d != nil {
		s += ": " + d.text
	}
	if r.Role() == RoleStreaming {
		if d := r.degraded(); d != "" {
			s += ": " + d
		}
	}
	return s
}

// degradedAfter is how long the marks may fail before the status of a
// streaming relay says so: a database restart or a failover passes
// quicker.
const degradedAfter = 20 * time.Second

// degraded says why a streaming relay does not do its whole job, "" when
// it does: its marks fail, or wait for a standby, so the slot cannot pass
// the events they are for (invariant 10, docs/architecture.md) and WAL piles up while the events
// still flow. Readiness stays: a restart would not help.
func (r *Relay) degraded() string {
	since, err := r.marksTrouble()
	if err == nil {
		return ""
	}
	how := "failing"
	if errors.As(err, new(*janitor.WaitError)) {
		how = "waiting" // written, not yet on a standby the slot needs them on
	}
	// Room for the grant the janitor's error names.
	return fmt.Sprintf("degraded: marks %s for %s, so the slot cannot advance: %s", how, time.Since(since).Round(time.Second), r.statusLine(err.Error(), 2*retryDetailMax))
}

// retryDetailMax bounds the error /readyz shows: enough for the cause
// (a missing exchange, a refused grant), short enough for a probe's body
// and `kubectl describe`.
const retryDetailMax = 200

// operatorDetailMax bounds the status of a relay that needs an operator:
// the problem and the whole remedy.
const operatorDetailMax = 3 * retryDetailMax

// retryDetail is the status detail while the relay backs off after a
// failed session: the error that ended it, so /readyz says what the relay
// waits for (docs/runbook.md). Both URLs and their passwords are scrubbed
// from it as from check's findings (config.Scrub), though the stages'
// errors never quote them.
func (r *Relay) retryDetail(err error) (Reason, string) {
	reason, prefix, msg, most := ReasonRetrying, "retrying after: ", err.Error(), retryDetailMax
	if s, ok := r.carryover.Stalled(); ok {
		// The row first, whatever error ended the session (a channel the
		// broker closed names no row): it is what an operator acts on.
		prefix += fmt.Sprintf("stalled on event %s (%s: exchange %q, routing key %q): ", s.ID, s.Cause, s.Exchange, s.RoutingKey)
	}
	var op *OperatorError
	if errors.As(err, &op) {
		// The remedy is the point: room for it whole, after a problem
		// that may quote the server (a pg_hba.conf line's host, user and
		// database).
		reason, prefix, msg, most = ReasonNeedsOperator, "needs an operator: ", op.Problem+"; "+op.Remedy, operatorDetailMax
	}
	return reason, prefix + r.statusLine(msg, most)
}

// statusLine makes msg fit a status: URLs' passwords scrubbed
// (config.Scrub), one line for the probe's body, at most most runes.
func (r *Relay) statusLine(msg string, most int) string {
	msg = strings.Join(strings.Fields(r.cfg.Scrub(msg)), " ")
	if rs := []rune(msg); len(rs) > most {
		msg = string(rs[:most]) + "…"
	}
	return msg
}

// When slot creation has waited this long the relay says for what, and
// then again every createReportEvery.
const (
	createReportAfter = 2 * time.Second
	createReportEvery = 30 * time.Second
)

// createSlot runs CREATE_REPLICATION_SLOT, which waits until every
// transaction that holds an xid anywhere in the cluster has ended: a
// forgotten prepared transaction or an idle-in-transaction session holds
// it up indefinitely. Meanwhile the relay reports what it waits for, on db
// (idle then: it only holds the slot lock). ctx ending cancels the wait on
// the server, so the walsender drops the half-made slot and stops waiting.
func (r *Relay) createSlot(ctx context.Context, db, sdb *pgx.Conn, repl *pgconn.PgConn) (slot.Created, error) {
	var stopWatch func()
	if sdb != db {
		// On a standby the wait is for the primary's next running-xacts
		// record, which the relay asks for (standby.go); bounded, since a
		// primary that never writes one (no grant, a wedged link) would
		// otherwise hold the session forever without a word in the log.
		if err := r.awaitReplay(ctx, db, sdb); err != nil {
			return slot.Created{}, err
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, standbyCreateWait, errStandbyCreate)
		defer cancel()
		stopWatch = r.nudgeStandby(ctx, db)
	} else {
		stopWatch = r.watchCreate(ctx, db, repl)
	}
	defer stopWatch()
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopCancel := context.AfterFunc(ctx, func() {
		// Closing the socket alone would leave the walsender waiting for
		// the blocking transactions; a cancel request ends its wait.
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		if repl.CancelRequest(rctx) != nil {
			cancel()
		}
		time.AfterFunc(5*time.Second, cancel)
	})
	defer stopCancel()
	created, err := slot.Create(cctx, repl, r.cfg.Slot)
	if ctx.Err() != nil {
		return slot.Created{}, context.Cause(ctx)
	}
	return created, err
}

// standbyCreateWait bounds slot creation on a standby; the session then
// fails and the next one tries again.
const standbyCreateWait = 2 * time.Minute

var errStandbyCreate = fmt.Errorf("creating the slot on the standby did not finish within %s: the primary wrote no running-xacts record the standby replayed (grant EXECUTE on pg_log_standby_snapshot(), and check that the standby streams)", standbyCreateWait)

// watchCreate reports, while slot creation waits, the transactions it waits
// for: a log line after createReportAfter and every createReportEvery, and
// the same in Status. The returned func stops it and clears the status; db
// is free again once it returns.
func (r *Relay) watchCreate(ctx context.Context, db *pgx.Conn, repl *pgconn.PgConn) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(done)
		wait := createReportAfter
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = createReportEvery
			r.reportCreateWait(ctx, db, repl, time.Since(began))
		}
	}()
	return func() {
		close(quit)
		<-done
		r.clearDetail()
	}
}

func (r *Relay) reportCreateWait(ctx context.Context, db *pgx.Conn, repl *pgconn.PgConn, waited time.Duration) {
	// A cancelled statement would close db and release the slot lock: the
	// query finishes even when ctx ends (it is a quick catalog read).
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	blockers, err := slot.CreateBlockers(qctx, db, int32(repl.PID()), waited, []int32{int32(db.PgConn().PID()), int32(repl.PID())})
	what := fmt.Sprintf("creating replication slot %s has waited %s for the transactions open when it began to end", r.cfg.Slot, waited.Round(time.Second))
	switch {
	case err != nil:
		r.log.Warn(what+"; could not list them", "error", err)
	case len(blockers) == 0:
		r.log.Warn(what + " (none is left; it should finish soon)")
	default:
		what += ": " + slot.Describe(blockers)
		r.log.Warn("replication slot creation is waiting for open transactions to end (commit or roll back prepared transactions, end idle-in-transaction sessions)",
			"waited", waited.Round(time.Second), "blockers", slot.Describe(blockers))
	}
	r.setDetail(ReasonCreatingSlot, what)
}
