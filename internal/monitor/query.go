package monitor

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
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

// query returns the statement refresh runs on the outbox's database for
// the table as it is now (backlogSQL, or backlogOnlySQL when the slot is on
// another server), logging each missing optional column once.
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
	if m.opts.SlotDatabaseURL != "" {
		m.sql = backlogOnlySQL(table, cols)
	}
	return m.sql, nil
}

// backlogOnlySQL reads the backlog alone, in one pass over the unpublished
// rows only: published_at IS NULL matches the partial index of
// migrations/0001 (event_outbox_unpublished_idx), so the cost follows the
// backlog, not the table (published rows waiting for retention are never
// read). Parked rows (last_error set) are counted apart and kept out of the
// count and the age: they wait for an operator, not for the relay.
func backlogOnlySQL(table string, cols columns) string {
	notParked, parked := "true", "false"
	if cols.lastError {
		notParked, parked = "last_error IS NULL", "last_error IS NOT NULL"
	}
	age := "NULL::float8"
	if cols.enqueuedAt {
		age = fmt.Sprintf("coalesce(extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE %s)), 0)::float8", notParked)
	}
	return fmt.Sprintf(`
		SELECT count(*) FILTER (WHERE %[2]s) AS unpublished,
		       count(*) FILTER (WHERE %[3]s) AS parked,
		       %[4]s AS oldest
		FROM %[1]s WHERE published_at IS NULL`, table, notParked, parked, age)
}

// slotHealth is the slot's part of a reading: its row of
// pg_replication_slots (s, joined on the slot's name, $1; NULLs when there
// is no such slot) and the WAL it holds back from the server's current
// position w.lsn.
const slotHealth = `s.wal_status, s.safe_wal_size,
		       coalesce(pg_wal_lsn_diff(w.lsn, s.restart_lsn), 0)::float8,
		       coalesce(pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn), 0)::float8`

// backlogSQL is one statement for every gauge when the slot is on the
// outbox's server, a primary.
func backlogSQL(table string, cols columns) string {
	return `
		SELECT b.unpublished, b.parked, b.oldest,
		       ` + slotHealth + `
		FROM (` + backlogOnlySQL(table, cols) + `) b
		CROSS JOIN (SELECT pg_current_wal_lsn() AS lsn) w
		LEFT JOIN pg_replication_slots s ON s.slot_name = $1`
}

// slotOnlySQL reads slotHealth on the slot's own server. That may be a
// standby, where pg_current_wal_lsn() fails: there the current position is
// what it has replayed, which is also what bounds the slot's progress.
const slotOnlySQL = `
		SELECT ` + slotHealth + `
		FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w
		LEFT JOIN pg_replication_slots s ON s.slot_name = $1`

// refresh reads every gauge (readGauges) and records the reading.
func (m *Monitor) refresh(ctx context.Context) error {
	if err := m.connectSlot(ctx); err != nil {
		return err
	}
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
	backlog := []any{&unpublished, &parked, &age}
	health := []any{&status, &safe, &retained, &lag}
	if err := m.readGauges(qctx, sql, backlog, health); err != nil {
		return err
	}
	others, err := m.otherRelays(qctx)
	if err != nil {
		return err
	}
	r := reading{unpublished: float64(unpublished), parked: float64(parked), oldest: nan(age), retained: retained, lag: lag, safeWAL: -1,
		otherRelays: float64(len(others))}
	if status != nil {
		r.walStatus = *status
	}
	// safe_wal_size is NULL when max_slot_wal_keep_size is unlimited.
	if safe != nil {
		r.safeWAL = float64(*safe)
	}
	m.c.succeeded(r)
	m.reportOthers(others)
	return nil
}

// readGauges scans the backlog and the slot's health into their
// destinations: with one statement (sql, backlogSQL) when the slot is on
// the outbox's server, else sql (backlogOnlySQL) there and slotOnlySQL on
// the slot's (slotDB).
func (m *Monitor) readGauges(ctx context.Context, sql string, backlog, health []any) error {
	if m.opts.SlotDatabaseURL == "" {
		if err := m.db.QueryRow(ctx, sql, m.opts.Slot).Scan(append(backlog, health...)...); err != nil {
			return fmt.Errorf("read backlog and slot health: %w", err)
		}
		return nil
	}
	if err := m.db.QueryRow(ctx, sql).Scan(backlog...); err != nil {
		return fmt.Errorf("read backlog: %w", err)
	}
	if err := m.slotDB.QueryRow(ctx, slotOnlySQL, m.opts.Slot).Scan(health...); err != nil {
		return fmt.Errorf("read slot health on the slot's server: %w", err)
	}
	return nil
}

// otherRelaysSQL lists the other logical slots of this database that
// pgoutput streams to a connection named like a relay: the default
// application_name, or the monitor's own (the relays of one values file
// share their URL, and with it an application_name the URL sets).
// application_name is readable in pg_stat_activity by every role, so the
// least-privilege role sees it. Which publication a walsender streams is
// not in the catalogs, so a relay of another outbox in the same database
// counts too; the log line and the runbook say so.
const otherRelaysSQL = `
	SELECT s.slot_name::text
	FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
	WHERE s.slot_type = 'logical' AND s.plugin = 'pgoutput' AND s.database = current_database()
	  AND s.slot_name <> $1 AND a.application_name IN ($2, current_setting('application_name'))
	ORDER BY 1`

// otherRelays returns the names of the other relays' slots
// (otherRelaysSQL).
func (m *Monitor) otherRelays(ctx context.Context) ([]string, error) {
	rows, err := m.db.Query(ctx, otherRelaysSQL, m.opts.Slot, pgconnect.ApplicationName)
	if err != nil {
		return nil, fmt.Errorf("read the other relays' slots: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the other relays' slots: %w", err)
	}
	return names, nil
}

// reportOthers logs the other relays' slots when they change: a warning
// naming them, once, not every interval, and a line when they are gone.
func (m *Monitor) reportOthers(names []string) {
	now := strings.Join(names, ",")
	if now == m.others {
		return
	}
	m.others = now
	if now == "" {
		m.log.Info("no other relay streams this database any more")
		return
	}
	m.log.Warn("another relay streams this database: if it relays the same outbox, every event is published twice (docs/runbook.md#cdcrelayotherrelayondatabase)",
		"other_slots", now, "slot", m.opts.Slot)
}
