// Package monitor reads the outbox backlog and the slot's health on a slow
// cadence, never on the hot path, and exports them as metrics.
package monitor

import (
	"context"
	"fmt"
	"log/slog"
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
	// Active reports whether this process streams the slot. Only the
	// streaming replica queries, so a standby adds no load on the primary.
	Active func() bool
}

// Monitor is a stage that refreshes its gauges every Interval.
type Monitor struct {
	opts Options
	log  *slog.Logger
	m    *metrics
	sql  string
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// New returns a Monitor with its metrics registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Monitor {
	table := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()
	return &Monitor{opts: opts, log: log, m: newMetrics(reg, opts.Slot), sql: fmt.Sprintf(`
		SELECT (SELECT count(*) FROM %[1]s WHERE published_at IS NULL),
		       (SELECT coalesce(extract(epoch FROM now() - min(enqueued_at)), 0) FROM %[1]s WHERE published_at IS NULL),
		       s.wal_status, s.safe_wal_size,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0),
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)
		FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, table)}
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
		}
		if err := m.refresh(ctx, db); err != nil {
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
	var pending int64
	var age, retained, lag float64
	var status *string
	var safe *int64
	if err := db.QueryRow(qctx, m.sql, m.opts.Slot).Scan(&pending, &age, &status, &safe, &retained, &lag); err != nil {
		return fmt.Errorf("read backlog and slot health: %w", err)
	}
	m.m.pending.Set(float64(pending))
	m.m.oldest.Set(age)
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
