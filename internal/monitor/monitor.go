// Package monitor reads the outbox backlog and the slot's health on a slow
// cadence, never on the hot path, and exports them as metrics.
package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Monitor.
type Options struct {
	DatabaseURL   string
	Schema, Table string
	Slot          string
	Interval      time.Duration
	// Active reports whether this process holds the slot (streams it, or
	// publishes a new slot's backlog). Only then does it query, so a
	// standby adds no load on the primary.
	Active func() bool
}

// Monitor is a stage that refreshes its gauges every Interval.
type Monitor struct {
	opts Options
	log  *slog.Logger
	m    *metrics
	// sql is the query for the table as last inspected; "" until a
	// connection has looked at the table, and again after a failure (the
	// table may have changed). Only the Run goroutine uses it.
	sql    string
	warned bool // the missing enqueued_at column was logged
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// New returns a Monitor with its metrics registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Monitor {
	return &Monitor{opts: opts, log: log, m: newMetrics(reg, opts.Slot)}
}

// query returns the backlog and slot health query for the table as it is
// now. The backlog's age needs enqueued_at; a mapped table without it gets
// the count alone (the age is NULL, exported as NaN), logged once.
func (m *Monitor) query(ctx context.Context, db *pgx.Conn) (string, error) {
	if m.sql != "" {
		return m.sql, nil
	}
	table := pgx.Identifier{m.opts.Schema, m.opts.Table}.Sanitize()
	var hasEnqueued bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = 'enqueued_at' AND attnum > 0 AND NOT attisdropped)`, table).Scan(&hasEnqueued)
	if err != nil {
		return "", fmt.Errorf("inspect %s: %w", table, err)
	}
	age := "(SELECT coalesce(extract(epoch FROM now() - min(enqueued_at)), 0)::float8 FROM %[1]s WHERE published_at IS NULL)"
	if !hasEnqueued {
		age = "NULL::float8"
		if !m.warned {
			m.warned = true
			m.log.Warn("the outbox table has no enqueued_at column: cdcrelay_oldest_unpublished_age_seconds is NaN; the backlog count is still reported", "table", table)
		}
	}
	m.sql = fmt.Sprintf(`
		SELECT (SELECT count(*) FROM %[1]s WHERE published_at IS NULL),
		       `+age+`,
		       s.wal_status, s.safe_wal_size,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0),
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)
		FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, table)
	return m.sql, nil
}

// Run refreshes the metrics until ctx ends. Failures are logged and
// counted; the next tick tries again with a new connection.
func (m *Monitor) Run(ctx context.Context) error {
	var db *pgx.Conn
	defer func() {
		if db != nil {
			_ = db.Close(context.Background())
		}
	}()
	tick := time.NewTicker(m.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if m.opts.Active != nil && !m.opts.Active() {
			// A standby (or a demoted relay) holds no backend for it.
			if db != nil {
				_ = db.Close(ctx)
				db = nil
			}
			continue
		}
		if db == nil || db.IsClosed() {
			var err error
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			db, err = pgx.Connect(cctx, m.opts.DatabaseURL)
			cancel()
			if err != nil {
				m.fail(ctx, fmt.Errorf("connect: %w", err))
				db = nil
				continue
			}
			m.sql = ""
		}
		if err := m.refresh(ctx, db); err != nil {
			m.sql = "" // inspect the table again: it may have changed
			m.fail(ctx, err)
		}
	}
}

func (m *Monitor) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		m.m.errors.Inc()
		m.log.Warn("monitor query failed; will retry", "error", err)
	}
}

func (m *Monitor) refresh(ctx context.Context, db *pgx.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, m.opts.Interval)
	defer cancel()
	sql, err := m.query(qctx, db)
	if err != nil {
		return err
	}
	var pending int64
	var retained, lag float64
	var age *float64
	var status *string
	var safe *int64
	if err := db.QueryRow(qctx, sql, m.opts.Slot).Scan(&pending, &age, &status, &safe, &retained, &lag); err != nil {
		return fmt.Errorf("read backlog and slot health: %w", err)
	}
	m.m.pending.Set(float64(pending))
	if age != nil {
		m.m.oldest.Set(*age)
	} else {
		m.m.oldest.Set(math.NaN())
	}
	m.m.retained.Set(retained)
	m.m.lag.Set(lag)
	for _, s := range walStatuses {
		v := 0.0
		if status != nil && *status == s {
			v = 1
		}
		m.m.walStatus.WithLabelValues(s).Set(v)
	}
	// safe_wal_size is NULL when max_slot_wal_keep_size is unlimited.
	if safe != nil {
		m.m.safeWAL.Set(float64(*safe))
	} else {
		m.m.safeWAL.Set(-1)
	}
	return nil
}
