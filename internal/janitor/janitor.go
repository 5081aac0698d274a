// Package janitor writes the fate of each event on its outbox row behind
// the relay: published_at for acknowledged events, attempts and last_error
// for parked poison ones.
//
// A mark is part of the slot's position (invariant 10, docs/architecture.md):
// the publisher hands each confirm to the janitor's Marks (marks.go), which
// acks the streaming session's watermark only after the UPDATE that marked
// the row has committed, durably whatever synchronous_commit says
// (pgconnect.Options.Durable), the row was parked, or the row was found
// gone. So the slot never passes a row that is not marked, and after any
// crash the events whose marks were not written are streamed, published
// and marked again.
package janitor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/backoff"
	"github.com/cdcrelay/cdcrelay/internal/config"
)

// Options configure a Janitor.
type Options struct {
	DatabaseURL string
	// SlotDatabaseURL, when set, is the standby that holds the slot
	// (CDCRELAY_REPLICATION_URL): marks are confirmed only once it shows
	// them (replica.go).
	SlotDatabaseURL string
	// Origin, when set, is the replication origin the janitor's
	// transactions carry (PostgreSQL 16+, with the grants).
	Origin string
	// Outbox is the table whose rows are marked, by its id column, and
	// the relay's slot: its marks wait for synchronized standbys if it is
	// a failover slot.
	config.Outbox
	MarkInterval time.Duration // how often queued marks are written
	MarkBatch    int           // ids per UPDATE
	// MaxPending bounds the marks queued and not yet written (default
	// 10,000). At the bound Marks.Ack waits, which stops the publisher's
	// confirm loop and so the publisher: back-pressure, never a drop.
	MaxPending int
	// BackoffMin and BackoffMax bound the wait after a failed connection
	// or statement; it doubles (with jitter) from BackoffMin (default
	// MarkInterval) up to BackoffMax (default 5s).
	BackoffMin, BackoffMax time.Duration
}

// Defaults and bounds.
const (
	// defaultMaxPending: a queued mark costs about 250 bytes of heap (id,
	// entry, completion closure), so this keeps the queue near 2.5 MiB, a
	// small share of the relay's memory next to its byte budget (invariant
	// 6), while covering 2 s of marks at 5,000 events/s.
	defaultMaxPending = 10_000
	// maxParked bounds the parked events waiting to be recorded; Parked
	// waits at the bound. Poison is rare: reaching it means recording fails.
	maxParked = 1000
	// idleClose is how long the connection stays open without work.
	idleClose = time.Minute
	// exitFlush bounds the flush after Run's context ended.
	exitFlush = 5 * time.Second
)

// entry is an acknowledged event waiting for its row to be marked.
type entry struct {
	id   string
	xid  uint32 // its transaction; 0: unknown (a snapshot row), visible by then
	done func() // called once the row is marked (or parked) or found gone
	// visible: a flush could not find the row although its transaction was
	// already visible to new snapshots, so the next flush that cannot find
	// it either knows it was deleted (see splitMarked).
	visible bool
}

// parked is a poison event to record on its row. Its entry waits for a
// row not visible yet as a mark's does (parkUnseen).
type parked struct {
	entry
	reason string
}

// Janitor is a stage: its Sessions queue work, Run writes it.
type Janitor struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	pending []entry
	parked  []parked
	held    int           // entries taken by a flush and not yet settled
	room    chan struct{} // closed when the queues shrink; nil: nobody waits
	wake    chan struct{} // a full batch or a parked event is waiting, or a flush was asked for
	// dbShuttingDown is closed, and replaced by a fresh channel, each time a
	// write fails because the database is shutting down (see DatabaseShuttingDown).
	dbShuttingDown chan struct{}
	// failSince is when the writes began to fail without a success since
	// (zero while they succeed or nothing waits), failErr the last
	// failure: Failing.
	failSince time.Time
	failErr   error
	// waitSince is when written marks began to wait for a standby (the
	// slot's, or those in synchronized_standby_slots) longer than
	// standbyWarn, zero when they do not; waitErr says for what: awaitingStandby.
	waitSince time.Time
	waitErr   error
	// hurrying counts the sessions waiting for their last marks
	// (Marks.Wait): Run then writes without waiting for its interval.
	hurrying int

	// Only the Run goroutine uses the fields below.
	db       *pgx.Conn
	lastWork time.Time
	retryAt  time.Time     // no attempt before this after a failure
	backoff  time.Duration // the last wait; zero after a success
	markSQL  string        // built with the id column's type; rebuilt when it goes stale
	parkSQL  string
	// replica is the connection to SlotDatabaseURL, replicaSQL its
	// question (replica.go).
	replica    *pgx.Conn
	replicaSQL string
	promoted   bool // the slot's server answered that it is not in recovery
	parkNoted  bool // a park that could not be recorded was reported
	// originNoted: whether marks carry Origin was logged.
	originNoted bool
	again       *time.Timer // wakes Run for the next write while hurrying (hurryOn)
}

// New returns a Janitor; its metrics are registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Janitor {
	if opts.MaxPending <= 0 {
		opts.MaxPending = defaultMaxPending
	}
	if opts.MarkBatch <= 0 {
		opts.MarkBatch = 1000
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = max(opts.MarkInterval, 10*time.Millisecond)
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 5 * time.Second
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffMin)
	j := &Janitor{opts: opts, log: log, wake: make(chan struct{}, 1), dbShuttingDown: make(chan struct{})}
	j.metrics = newMetrics(reg, opts.Slot, func() float64 {
		if since, _ := j.Failing(); !since.IsZero() {
			return time.Since(since).Seconds()
		}
		return 0
	})
	return j
}

// Failing reports since when the writes have failed with no success in
// between, and the last failure; a zero time while they succeed or nothing
// waits to be written. The relay's status says so after a while: the slot
// cannot pass the unmarked events (invariant 10, docs/architecture.md).
// Marks written but waiting for a standby (awaitingStandby) hold the slot back as
// well, and are reported the same way, with a *WaitError, while no write
// fails.
func (j *Janitor) Failing() (since time.Time, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failSince.IsZero() {
		return j.waitSince, j.waitErr
	}
	return j.failSince, j.failErr
}

// WaitError is what written marks wait for before the slot may pass them.
type WaitError struct{ What string }

func (e *WaitError) Error() string { return e.What }

// awaitingStandby records that written marks have waited since began for what
// (nil: they wait no more).
func (j *Janitor) awaitingStandby(began time.Time, what *WaitError) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if what == nil {
		j.waitSince, j.waitErr = time.Time{}, nil
		return
	}
	j.waitSince, j.waitErr = began, what
}

// failing records a write's outcome for Failing.
func (j *Janitor) failing(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case err == nil:
		j.failSince, j.failErr = time.Time{}, nil
	case j.failSince.IsZero():
		j.failSince, j.failErr = time.Now(), err
	default:
		j.failErr = err
	}
}

// mark queues the row of an acknowledged event to be marked published_at;
// done is called from Run once that is durable (or the row is gone). xid
// is the event's transaction (0 when unknown): a row that cannot be found
// while that transaction is not yet visible to other sessions (its commit
// waits for a synchronous standby) is waited for, never counted as gone.
// mark waits while MaxPending marks are queued, until there is room or ctx
// ends; it then returns ctx's error and done is never called.
func (j *Janitor) mark(ctx context.Context, id string, xid uint32, done func()) error {
	full := false
	err := j.enqueue(ctx, func() bool { return len(j.pending)+j.held < j.opts.MaxPending }, func() {
		j.pending = append(j.pending, entry{id: id, xid: xid, done: done})
		full = len(j.pending) >= j.opts.MarkBatch
	})
	if err == nil && full {
		j.Flush()
	}
	return err
}

// park queues a poison event's row to get attempts+1 and last_error (it
// stays unpublished); done is called once that is recorded, once recording
// turned out impossible (no grant or no such column), or once the row is
// found gone. It waits like mark while maxParked events are queued.
func (j *Janitor) park(ctx context.Context, id string, xid uint32, reason string, done func()) error {
	err := j.enqueue(ctx, func() bool { return len(j.parked) < maxParked }, func() {
		j.parked = append(j.parked, parked{entry: entry{id: id, xid: xid, done: done}, reason: reason})
	})
	if err == nil {
		j.Flush()
	}
	return err
}

// Flush asks Run to write what is queued now rather than at the next tick
// (still respecting the backoff after a failure). It never blocks.
func (j *Janitor) Flush() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// enqueue runs add under mu once fits holds, waiting for room until ctx
// ends. Nothing is ever dropped to make room.
func (j *Janitor) enqueue(ctx context.Context, fits func() bool, add func()) error {
	for {
		j.mu.Lock()
		if fits() {
			add()
			j.mu.Unlock()
			return nil
		}
		if j.room == nil {
			j.room = make(chan struct{})
		}
		room := j.room
		j.mu.Unlock()
		j.metrics.waits.Inc()
		j.Flush()
		select {
		case <-room:
		case <-ctx.Done():
			return fmt.Errorf("wait for room among the unwritten marks: %w", ctx.Err())
		}
	}
}

// freed wakes the callers waiting for room. Caller holds mu.
func (j *Janitor) freed() {
	if j.room != nil {
		close(j.room)
		j.room = nil
	}
}

// Pending returns how many marks and parks wait to be written.
func (j *Janitor) Pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending) + j.held + len(j.parked)
}

// Run writes queued marks until ctx ends, then flushes what it still holds
// (for at most a few seconds). It connects only when there is work, backs
// off after a failure, and never stops the relay.
func (j *Janitor) Run(ctx context.Context) error {
	defer j.flushOnExit()
	tick := time.NewTicker(j.opts.MarkInterval)
	defer tick.Stop()
	defer func() {
		if j.again != nil {
			j.again.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-j.wake:
		}
		j.turn(ctx)
	}
}

// turn writes the queued work if there is any and the backoff allows.
func (j *Janitor) turn(ctx context.Context) {
	defer j.hurryOn()
	now := time.Now()
	if j.Pending() == 0 {
		j.failing(nil) // nothing waits: nothing fails
		if j.db != nil && now.Sub(j.lastWork) > idleClose {
			j.closeDB()
		}
		return
	}
	if now.Before(j.retryAt) {
		return
	}
	j.lastWork = now
	down, err := j.writeOrLearn(ctx)
	if err == nil {
		if j.backoff > 0 {
			j.log.Info("janitor writes again")
		}
		j.backoff = 0
		j.failing(nil)
		return
	}
	if ctx.Err() != nil {
		return
	}
	j.failing(j.explainDenied(err))
	if down {
		j.databaseShuttingDown()
	}
	j.backoff = backoff.Next(j.backoff, j.opts.BackoffMin, j.opts.BackoffMax)
	wait := backoff.Jitter(j.backoff)
	j.retryAt = time.Now().Add(wait)
	j.metrics.errors.Inc()
	j.log.Warn("janitor could not write; will retry", "error", j.explainDenied(err), "retry_in", wait.Round(time.Millisecond), "queued", j.Pending())
}

// writeOrLearn writes, and reports whether the failure, if any, says that
// the database is shutting down. An open connection that was lost (57P01
// admin_shutdown, a reset, an EOF) does not tell by itself: a fast
// shutdown terminates it, but so do a pg_terminate_backend of this backend
// alone, a proxy or the network. A new connection tells at once: 57P03
// while the server shuts down, a second 57P01 right away too. A backend
// terminated (57P01) during the new connection's set-up (its durable
// synchronous_commit, its origin) is such a lost connection too.
func (j *Janitor) writeOrLearn(ctx context.Context) (down bool, err error) {
	if err = j.connect(ctx); err != nil && !terminated(err) {
		return shuttingDown(err), err
	}
	if err == nil {
		err = j.write(ctx)
		if err == nil || shuttingDown(err) || j.db != nil || ctx.Err() != nil {
			return shuttingDown(err), err
		}
	}
	if ctx.Err() != nil {
		return false, err
	}
	j.log.Info("janitor's connection was lost; connecting again at once", "error", err)
	err = j.write(ctx)
	return shuttingDown(err) || terminated(err), err
}
