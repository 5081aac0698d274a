package monitor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// columns are the optional outbox columns the query depends on.
type columns struct {
	enqueuedAt, lastError bool
}

// inspect reads which optional columns the table has now.
func (m *Monitor) inspect(ctx context.Context, table string) (columns, error) {
	var c columns
	err := m.db.QueryRow(ctx, `
		SELECT coalesce(bool_or(attname = 'enqueued_at'), false), coalesce(bool_or(attname = 'last_error'), false)
		FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname IN ('enqueued_at', 'last_error') AND attnum > 0 AND NOT attisdropped`,
		table).Scan(&c.enqueuedAt, &c.lastError)
	if err != nil {
		return c, fmt.Errorf("inspect %s: %w", table, err)
	}
	return c, nil
}

// query returns the backlog and slot health query for the table as it is
// now, logging each missing optional column once.
func (m *Monitor) query(ctx context.Context) (string, error) {
	if m.sql != "" {
		return m.sql, nil
	}
	table := pgx.Identifier{m.opts.Schema, m.opts.Table}.Sanitize()
	cols, err := m.inspect(ctx, table)
	if err != nil {
		return "", err
	}
	if !cols.enqueuedAt && !m.warned["enqueued_at"] {
		m.warned["enqueued_at"] = true
		m.log.Warn("the outbox table has no enqueued_at column: cdcrelay_oldest_unpublished_age_seconds is NaN; the backlog count is still reported", "table", table)
	}
	if !cols.lastError && !m.warned["last_error"] {
		m.warned["last_error"] = true
		m.log.Info("the outbox table has no last_error column: parked rows cannot be told apart, cdcrelay_outbox_parked is 0 and parked rows count as unpublished", "table", table)
	}
	m.sql = backlogSQL(table, cols)
	return m.sql, nil
}

// backlogSQL is one statement for every gauge. The backlog is read in one
// pass over the unpublished rows only: published_at IS NULL matches the
// partial index of migrations/0001 (event_outbox_unpublished_idx), so the
// cost follows the backlog, not the table (published rows waiting for
// retention are never read). Parked rows (last_error set) are counted apart
// and kept out of the count and the age: they wait for an operator, not
// for the relay.
func backlogSQL(table string, cols columns) string {
	notParked, parked := "true", "false"
	if cols.lastError {
		notParked, parked = "last_error IS NULL", "last_error IS NOT NULL"
	}
	age := "NULL::float8"
	if cols.enqueuedAt {
		age = fmt.Sprintf("coalesce(extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE %s)), 0)::float8", notParked)
	}
	return fmt.Sprintf(`
		SELECT b.unpublished, b.parked, b.oldest,
		       s.wal_status, s.safe_wal_size,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::float8,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::float8
		FROM (SELECT count(*) FILTER (WHERE %[2]s) AS unpublished,
		             count(*) FILTER (WHERE %[3]s) AS parked,
		             %[4]s AS oldest
		      FROM %[1]s WHERE published_at IS NULL) b
		LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, table, notParked, parked, age)
}

// refresh reads every gauge in one statement and records the reading.
func (m *Monitor) refresh(ctx context.Context) error {
	qctx, cancel := m.statementContext(ctx)
	defer cancel()
	sql, err := m.query(qctx)
	if err != nil {
		return err
	}
	var unpublished, parked int64
	var retained, lag float64
	var age *float64
	var status *string
	var safe *int64
	if err := m.db.QueryRow(qctx, sql, m.opts.Slot).Scan(&unpublished, &parked, &age, &status, &safe, &retained, &lag); err != nil {
		return fmt.Errorf("read backlog and slot health: %w", err)
	}
	r := reading{unpublished: float64(unpublished), parked: float64(parked), oldest: nan(age), retained: retained, lag: lag, safeWAL: -1}
	if status != nil {
		r.walStatus = *status
	}
	// safe_wal_size is NULL when max_slot_wal_keep_size is unlimited.
	if safe != nil {
		r.safeWAL = float64(*safe)
	}
	m.c.succeeded(r)
	return nil
}
