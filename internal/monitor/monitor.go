// Package monitor reads the outbox backlog and the slot's health on a slow
// cadence, never on the hot path, and exports them as metrics.
//
// Every replica of a slot runs a monitor, whatever its role. They compete
// for the monitor lock (a session advisory lock in the outbox database, see
// pgconnect.MonitorLockClass): the one holding it refreshes every interval, so
// the gauges stay fresh during a broker outage or while nothing streams;
// the others run one pg_try_advisory_lock per interval and nothing else.
// Only the holder exports the gauges, and only while its last refresh is
// recent (docs/architecture.md, monitor).
package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// Options configure a Monitor.
type Options struct {
	DatabaseURL string
	// SlotDatabaseURL is the server holding the slot when it is not
	// DatabaseURL's, e.g. a physical standby: the holder reads the slot's
	// health there, on a connection of its own, and the backlog and the
	// lock on DatabaseURL; it looks for other relays' slots on both. ""
	// means DatabaseURL.
	SlotDatabaseURL string
	// Outbox is the table whose backlog is read and the slot whose
	// health is read (and whose name keys the monitor lock).
	config.Outbox
	Interval time.Duration
	// Now is the clock the freshness of the gauges is judged by; nil
	// means time.Now.
	Now func() time.Time
}

// Monitor is a stage that refreshes its gauges every Interval while it
// holds the monitor lock.
type Monitor struct {
	opts   Options
	log    *slog.Logger
	c      *collector
	errors prometheus.Counter

	// Only the Run goroutine uses the fields below.
	db     *pgx.Conn // the monitor's own connection; nil when closed
	slotDB *pgx.Conn // its connection to SlotDatabaseURL, opened by the holder; nil when closed or unused
	held   bool      // db's session holds the monitor lock
	// plan is the backlog query for the table as last inspected; nil
	// until a connection has looked at the table, and again after a
	// failure (the table may have changed).
	plan  *plan
	floor floor // the bounded scan's, with plan

	warned map[string]bool // missing columns already logged
	others string          // the other relays' slots last logged, comma-separated ("|" then those on the slot's server)
	// relayApps are the application_names another relay's walsender may
	// carry (relayNames), read once from the URLs.
	relayApps []string
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// minQueryTimeout bounds a statement's timeout from below, so that a short
// interval on a busy machine does not turn slow statements into lost locks.
const minQueryTimeout = 5 * time.Second

// New returns a Monitor with its metrics registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Monitor {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	m := &Monitor{
		opts: opts, log: log, warned: map[string]bool{}, relayApps: relayNames(opts.DatabaseURL, opts.SlotDatabaseURL),
		c: newCollector(opts.Slot, opts.Interval, now),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cdcrelay_monitor_errors_total", Help: "Monitor connections and statements (lock attempts, backlog and slot health queries) that failed.",
			ConstLabels: prometheus.Labels{"slot": opts.Slot},
		}),
	}
	reg.MustRegister(m.c, m.errors)
	return m
}

// Run tries at once, then every Interval, until ctx ends. Failures are
// logged and counted; the next turn tries again with a new connection.
// The connection is closed on return, which releases the lock.
func (m *Monitor) Run(ctx context.Context) error {
	defer m.drop()
	tick := time.NewTicker(m.opts.Interval)
	defer tick.Stop()
	for {
		m.turn(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// turn is one interval's work: a non-holder tries the lock (one statement)
// and stops there unless it got it; the holder refreshes.
func (m *Monitor) turn(ctx context.Context) {
	if m.db == nil {
		if err := m.connect(ctx); err != nil {
			m.fail(ctx, err)
			return
		}
	}
	if !m.held {
		ok, err := m.tryLock(ctx)
		if err != nil {
			m.fail(ctx, err)
			m.drop()
			return
		}
		if !ok {
			return
		}
		m.held = true
		m.c.setHolder(true)
		m.log.Info("took the monitor lock: this replica refreshes the backlog and slot gauges")
	}
	if err := m.refresh(ctx); err != nil {
		m.plan = nil // inspect the table again: it may have changed
		m.floor.reset()
		m.fail(ctx, err)
		// Give the lock up with the connection: a holder that cannot
		// refresh must not keep another replica, which may succeed, from
		// taking over. The next turn connects again.
		m.drop()
	}
}

// connect opens the monitor's connection, set up like the slot lock's
// (pgconnect.Options.LockHolder): it sits idle between turns, so a role's
// idle_session_timeout would end it, and the holder's lock with it, every
// interval; and the statement timeout is the monitor's own (statementContext),
// not a shorter one of the role's that a large backlog would trip every turn.
func (m *Monitor) connect(ctx context.Context) error {
	db, err := dial(ctx, m.opts.DatabaseURL, "to database for the monitor")
	if err != nil {
		return err
	}
	m.db, m.plan = db, nil
	m.floor.reset()
	return nil
}

// connectSlot opens the connection to SlotDatabaseURL if there is one and
// it is not open. Only the holder needs it, so the replicas waiting for the
// lock keep one connection each, to DatabaseURL; it idles between refreshes
// like the first one, hence the same set-up.
func (m *Monitor) connectSlot(ctx context.Context) error {
	if m.opts.SlotDatabaseURL == "" || m.slotDB != nil {
		return nil
	}
	db, err := dial(ctx, m.opts.SlotDatabaseURL, "to the slot's server for the monitor")
	if err != nil {
		return err
	}
	m.slotDB = db
	return nil
}

// dial opens a monitor connection to url for role (see connect): set up as
// a lock holder's, whether it holds the monitor lock or idles beside it.
func dial(ctx context.Context, url, role string) (*pgx.Conn, error) {
	return pgconnect.Connect(ctx, url, role, pgconnect.Options{LockHolder: true})
}

// tryLock takes the monitor lock if it is free. Session advisory locks
// stack, so it is only called while this session does not hold it.
func (m *Monitor) tryLock(ctx context.Context) (bool, error) {
	qctx, cancel := m.statementContext(ctx)
	defer cancel()
	var ok bool
	err := m.db.QueryRow(qctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, pgconnect.MonitorLockClass, m.opts.Slot).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("try the monitor lock: %w", err)
	}
	return ok, nil
}

// drop closes the connections, and with the first one the lock if held.
func (m *Monitor) drop() {
	if m.held {
		m.held = false
		m.c.setHolder(false)
		m.log.Info("released the monitor lock (connection closed)")
	}
	closeConn(&m.db)
	closeConn(&m.slotDB)
	m.plan = nil
	m.floor.reset()
}

// closeConn closes *db, if open, and forgets it.
func closeConn(db **pgx.Conn) {
	if *db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = (*db).Close(ctx)
	cancel()
	*db = nil
}

func (m *Monitor) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(m.opts.Interval, minQueryTimeout))
}

func (m *Monitor) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		m.errors.Inc()
		m.log.Warn("monitor failed; will retry", "error", err)
	}
}
