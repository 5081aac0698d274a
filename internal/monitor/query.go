package monitor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// columns are the optional outbox columns the query depends on, and the
// indexes it can use.
type columns struct {
	enqueuedAt, lastError bool
	// unpublishedIndex: a valid index on published_at IS NULL rows
	// (migrations/0001). enqueuedIndex: a valid index on every row's
	// enqueued_at (the HOT layout's).
	unpublishedIndex, enqueuedIndex bool
}

// inspect reads which optional columns and indexes the table has now.
func (m *Monitor) inspect(ctx context.Context, table string) (columns, error) {
	var c columns
	err := m.db.QueryRow(ctx, `
		SELECT coalesce(bool_or(attname = 'enqueued_at'), false), coalesce(bool_or(attname = 'last_error'), false),
		       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = $1::regclass AND i.indisvalid
		                 AND pg_get_expr(i.indpred, i.indrelid) = '(published_at IS NULL)'),
		       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = $1::regclass AND i.indisvalid AND i.indpred IS NULL AND a.attname = 'enqueued_at')
		FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname IN ('enqueued_at', 'last_error') AND attnum > 0 AND NOT attisdropped`,
		table).Scan(&c.enqueuedAt, &c.lastError, &c.unpublishedIndex, &c.enqueuedIndex)
	if err != nil {
		return c, fmt.Errorf("inspect %s: %w", table, err)
	}
	return c, nil
}

// plan is the backlog statement for the table as last inspected: full
// reads every unpublished row; bounded, set only on a table with an index
// on enqueued_at and none on its unpublished rows, reads those at or above
// the floor (floor.go), its last parameter.
type plan struct {
	cols          columns
	full, bounded string
}

// query returns the statement refresh runs on the outbox's database for
// the table as it is now (backlogSQL, or backlogOnlySQL when the slot is on
// another server) and its arguments, logging each missing optional column
// once. The table is inspected on every refresh, so that a layout changed
// under a running relay (cdcrelay migrate -hot-marks) is used at once; a
// change forgets the floor.
func (m *Monitor) query(ctx context.Context) (string, []any, error) {
	table := pgx.Identifier{m.opts.Schema, m.opts.Table}.Sanitize()
	cols, err := m.inspect(ctx, table)
	if err != nil {
		return "", nil, err
	}
	if m.plan == nil || m.plan.cols != cols {
		m.plan = m.newPlan(table, cols)
		m.floor.reset()
	}
	var args []any
	if m.opts.SlotDatabaseURL == "" {
		args = append(args, m.opts.Slot)
	}
	if m.plan.bounded == "" {
		return m.plan.full, args, nil
	}
	if err := m.observeNow(ctx); err != nil {
		return "", nil, err
	}
	if m.floor.at == nil {
		return m.plan.full, args, nil
	}
	return m.plan.bounded, append(args, *m.floor.at), nil
}

// newPlan writes the statements for cols, logging what the table lacks.
func (m *Monitor) newPlan(table string, cols columns) *plan {
	if !cols.enqueuedAt && !m.warned["enqueued_at"] {
		m.warned["enqueued_at"] = true
		m.log.Warn("the outbox table has no enqueued_at column: cdcrelay_oldest_unpublished_age_seconds is NaN; the backlog count is still reported", "table", table)
	}
	if !cols.lastError && !m.warned["last_error"] {
		m.warned["last_error"] = true
		m.log.Info("the outbox table has no last_error column: parked rows cannot be told apart, cdcrelay_outbox_parked is 0 and parked rows count as unpublished", "table", table)
	}
	bounded := !cols.unpublishedIndex && cols.enqueuedAt && cols.enqueuedIndex
	if !cols.unpublishedIndex && !bounded && !m.warned["index"] {
		m.warned["index"] = true
		m.log.Warn("no index serves the backlog query (one on published_at IS NULL rows, or on enqueued_at): each refresh reads the whole table", "table", table)
	}
	wrap := func(backlog string) string {
		if m.opts.SlotDatabaseURL != "" {
			return backlog
		}
		return backlogSQL(backlog)
	}
	p := &plan{cols: cols, full: wrap(backlogOnlySQL(table, cols, ""))}
	if bounded {
		param := "$1"
		if m.opts.SlotDatabaseURL == "" {
			param = "$2" // after the slot's name
		}
		p.bounded = wrap(backlogOnlySQL(table, cols, param))
	}
	return p
}

// backlogOnlySQL reads the backlog alone, in one pass over the unpublished
// rows only: published_at IS NULL matches the partial index of
// migrations/0001 (event_outbox_unpublished_idx), so the cost follows the
// backlog, not the table (published rows waiting for retention are never
// read). Parked rows (last_error set) are counted apart and kept out of the
// count and the age: they wait for an operator, not for the relay. With
// floorParam (the HOT layout: no such index) it reads the rows with
// enqueued_at at or above that parameter, along the index on enqueued_at,
// and counts the parked rows of the whole table apart (the layout's index
// on them), since a parked row does not hold the floor.
func backlogOnlySQL(table string, cols columns, floorParam string) string {
	notParked, parked := "true", "count(*) FILTER (WHERE false)"
	if cols.lastError {
		notParked, parked = "last_error IS NULL", "count(*) FILTER (WHERE last_error IS NOT NULL)"
		if floorParam != "" {
			parked = fmt.Sprintf("(SELECT count(*) FROM %s WHERE last_error IS NOT NULL AND published_at IS NULL)", table)
		}
	}
	age, oldestAt := "NULL::float8", "NULL::timestamptz"
	if cols.enqueuedAt {
		oldestAt = fmt.Sprintf("min(enqueued_at) FILTER (WHERE %s)", notParked)
		age = fmt.Sprintf("coalesce(extract(epoch FROM now() - %s), 0)::float8", oldestAt)
	}
	where := "published_at IS NULL"
	if floorParam != "" {
		where = fmt.Sprintf("enqueued_at >= %s::timestamptz AND published_at IS NULL", floorParam)
	}
	return fmt.Sprintf(`
		SELECT count(*) FILTER (WHERE %[2]s) AS unpublished,
		       %[3]s AS parked,
		       %[4]s AS oldest, %[5]s AS oldest_at
		FROM %[1]s WHERE %[6]s`, table, notParked, parked, age, oldestAt, where)
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
func backlogSQL(backlog string) string {
	return `
		SELECT b.unpublished, b.parked, b.oldest, b.oldest_at,
		       ` + slotHealth + `
		FROM (` + backlog + `) b
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
	sql, args, err := m.query(qctx)
	if err != nil {
		return err
	}
	var unpublished, parked int64
	var retained, lag float64
	var age *float64
	var oldestAt *time.Time
	var status *string
	var safe *int64
	backlog := []any{&unpublished, &parked, &age, &oldestAt}
	health := []any{&status, &safe, &retained, &lag}
	if err := m.readGauges(qctx, sql, args, backlog, health); err != nil {
		return err
	}
	m.floor.scanned(oldestAt)
	others, onSlotServer, err := m.otherRelays(qctx)
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
	m.reportOthers(others, onSlotServer)
	return nil
}

// readGauges scans the backlog and the slot's health into their
// destinations: with one statement (sql, backlogSQL) when the slot is on
// the outbox's server, else sql (backlogOnlySQL) there and slotOnlySQL on
// the slot's (slotDB).
func (m *Monitor) readGauges(ctx context.Context, sql string, args, backlog, health []any) error {
	if m.opts.SlotDatabaseURL == "" {
		if err := m.db.QueryRow(ctx, sql, args...).Scan(append(backlog, health...)...); err != nil {
			return fmt.Errorf("read backlog and slot health: %w", err)
		}
		return nil
	}
	if err := m.db.QueryRow(ctx, sql, args...).Scan(backlog...); err != nil {
		return fmt.Errorf("read backlog: %w", err)
	}
	if err := m.slotDB.QueryRow(ctx, slotOnlySQL, m.opts.Slot).Scan(health...); err != nil {
		return fmt.Errorf("read slot health on the slot's server: %w", err)
	}
	return nil
}

// otherRelaysSQL lists the other logical slots of this database that
// pgoutput streams to a connection named like a relay: the default
// application_name, or that of one of the relay's URLs ($2, relayNames),
// or the connection's own (the relays of one values file share their
// URLs, and with them an application_name the URL sets).
// application_name is readable in pg_stat_activity by every role, so the
// least-privilege role sees it. Which publication a walsender streams is
// not in the catalogs, so a relay of another outbox in the same database
// counts too; the log line and the runbook say so. It runs on the outbox's
// server and, with the slot on a standby, on that standby too
// (otherRelays).
const otherRelaysSQL = `
	SELECT s.slot_name::text
	FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
	WHERE s.slot_type = 'logical' AND s.plugin = 'pgoutput' AND s.database = current_database()
	  AND s.slot_name <> $1 AND (a.application_name = ANY($2::text[]) OR a.application_name = current_setting('application_name'))
	ORDER BY 1`

// relayNames are the application_names a relay's walsender may carry:
// pgconnect's default and those the relay's URLs set. A relay whose slot
// is on the primary streams under its CDCRELAY_DATABASE_URL's name, one
// whose slot is on the standby under its CDCRELAY_REPLICATION_URL's, and
// either may be the relay this monitor looks for on the other server.
func relayNames(urls ...string) []string {
	names := []string{pgconnect.ApplicationName}
	for _, u := range urls {
		if u == "" {
			continue
		}
		if c, err := pgconnect.Config(u, nil); err == nil {
			if app := c.RuntimeParams["application_name"]; app != "" && !slices.Contains(names, app) {
				names = append(names, app)
			}
		}
	}
	return names
}

// otherRelays returns the names of the other relays' slots
// (otherRelaysSQL) on the outbox's server and, when the slot is on another
// server (SlotDatabaseURL, a standby), there too: a relay whose slot is on
// the standby publishes every event as surely as one on the primary, and
// is invisible from the primary (its walsender runs on the standby). Both
// servers are asked whichever holds this relay's slot, since another relay
// may have its slot on either. all is the sorted union of the names (a
// name found on both counts once: both URLs may reach one server after a
// promotion); onSlotServer those found on the slot's server.
func (m *Monitor) otherRelays(ctx context.Context) (all, onSlotServer []string, err error) {
	all, err = otherRelaysOn(ctx, m.db, m.opts.Slot, m.relayApps)
	if err != nil || m.slotDB == nil {
		return all, nil, err
	}
	onSlotServer, err = otherRelaysOn(ctx, m.slotDB, m.opts.Slot, m.relayApps)
	if err != nil {
		return nil, nil, fmt.Errorf("on the slot's server: %w", err)
	}
	for _, n := range onSlotServer {
		if !slices.Contains(all, n) {
			all = append(all, n)
		}
	}
	slices.Sort(all)
	return all, onSlotServer, nil
}

// otherRelaysOn runs otherRelaysSQL on db.
func otherRelaysOn(ctx context.Context, db *pgx.Conn, slot string, names []string) ([]string, error) {
	rows, err := db.Query(ctx, otherRelaysSQL, slot, names)
	if err != nil {
		return nil, fmt.Errorf("read the other relays' slots: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the other relays' slots: %w", err)
	}
	return found, nil
}

// reportOthers logs the other relays' slots when they change: a warning
// naming them, once, not every interval, and a line when they are gone.
// With the slot on a standby it says which of them are there
// (on_replication_server): that is where their slots are dropped.
func (m *Monitor) reportOthers(names, onSlotServer []string) {
	now, there := strings.Join(names, ","), strings.Join(onSlotServer, ",")
	key := now
	if there != "" {
		key += "|" + there
	}
	if key == m.others {
		return
	}
	m.others = key
	if now == "" {
		m.log.Info("no other relay streams this database any more")
		return
	}
	attrs := []any{"other_slots", now}
	if there != "" {
		attrs = append(attrs, "on_replication_server", there)
	}
	m.log.Warn("another relay streams this database: if it relays the same outbox, every event is published twice (docs/runbook.md#cdcrelayotherrelayondatabase)",
		append(attrs, "slot", m.opts.Slot)...)
}
