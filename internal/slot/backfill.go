package slot

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// A FETCH asks for at most backfillBatch rows and aims at about
// backfillFetchBytes: it starts at backfillFirstFetch rows and grows (at
// most fourfold per FETCH) while the rows are small, shrinking at once when
// they are large. Memory does not depend on it (rows are handed on one at a
// time as they arrive, see fetchBackfill), but a FETCH that fits in the
// socket's buffers is finished by the server without waiting for the
// publisher, so no statement stays open behind a slow broker, and small
// rows still come 500 to a round trip.
const (
	backfillBatch      = 500
	backfillFirstFetch = 16
	backfillFetchBytes = 1 << 20
)

// Sequencer assigns the events' sequence numbers (slot.Watermark does).
type Sequencer interface{ Event() uint64 }

// Backfill reads every row with published_at IS NULL from the slot's
// exported snapshot, oldest first, and sends each to out as an event. The
// snapshot holds exactly the rows committed before the slot's consistent
// point; everything after is in the slot's stream, so together they leave
// no gap. Events carry the slot's consistent point as commit LSN and their
// position in the backfill as index: every row was committed before that
// point and every streamed transaction commits after it, so consumers see
// one order. out is closed when Backfill returns.
//
// Memory is bounded by bytes, not rows (invariant 6, docs/reliability.md):
// each row is sent to out as soon as it is read, before the next is read,
// so Backfill holds one row whatever its neighbours' sizes, and out's
// reader takes the byte budget. A row larger than m.MaxMessageBytes is
// judged from its length in the database and read without its values: it
// becomes a poison event with a Problem naming its size.
func Backfill(ctx context.Context, db *pgx.Conn, c Created, m wal.Mapping, seq Sequencer, out chan<- wal.Event) (int, error) {
	defer close(out)
	query, err := backfillQuery(ctx, db, m)
	if err != nil {
		return 0, err
	}
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("begin backfill: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", strings.ReplaceAll(c.Snapshot, "'", "''"))); err != nil {
		return 0, fmt.Errorf("import slot snapshot: %w", err)
	}
	if _, err := tx.Exec(ctx, "DECLARE cdcrelay_backfill NO SCROLL CURSOR FOR "+query); err != nil {
		return 0, fmt.Errorf("declare backfill cursor: %w", err)
	}
	n, count := 0, backfillFirstFetch
	send := func(ev wal.Event) error {
		ev.Seq, ev.CommitLSN, ev.Index = seq.Event(), c.ConsistentPoint, n
		select {
		case out <- ev:
			n++
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		got, bytes, err := fetchBackfill(ctx, tx, count, m, send)
		if err != nil {
			return n, err
		}
		if got < count {
			return n, nil
		}
		count = nextFetch(count, got, bytes)
	}
}

// nextFetch sizes the next FETCH from the last one, which asked for asked
// rows and returned got rows of bytes bytes in all: as many rows of their
// average size as fit in backfillFetchBytes, at most four times asked and
// backfillBatch, at least one. Below backfillBatch the count is rounded
// down to a power of two: each count is a statement the connection
// prepares and caches, so the counts in use stay few.
func nextFetch(asked, got int, bytes int64) int {
	want := min(4*asked, backfillBatch)
	if got > 0 {
		avg := max(bytes/int64(got), 1)
		want = int(min(backfillFetchBytes/avg, int64(want)))
	}
	if want >= backfillBatch {
		return backfillBatch
	}
	n := 1
	for n*2 <= want {
		n *= 2
	}
	return n
}

// fetchBackfill runs one FETCH of count rows and hands each row to send as
// soon as it is read: a batch is never held whole. It returns the rows read
// and their bytes.
func fetchBackfill(ctx context.Context, tx pgx.Tx, count int, m wal.Mapping, send func(wal.Event) error) (int, int64, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf("FETCH %d FROM cdcrelay_backfill", count))
	if err != nil {
		return 0, 0, fmt.Errorf("fetch backlog: %w", err)
	}
	defer rows.Close()
	got, bytes := 0, int64(0)
	for rows.Next() {
		ev, size, err := scanEvent(rows, m)
		if err != nil {
			return got, bytes, err
		}
		got, bytes = got+1, bytes+size
		if err := send(ev); err != nil {
			return got, bytes, err
		}
	}
	if err := rows.Err(); err != nil {
		return got, bytes, fmt.Errorf("read backlog: %w", err)
	}
	return got, bytes, nil
}

// scanEvent turns one backlog row into an event and returns the bytes it
// read: the row's size, or only its id's when it is oversize.
func scanEvent(rows pgx.Rows, m wal.Mapping) (wal.Event, int64, error) {
	ev := wal.Event{Backfill: true}
	var id, key, headers, exchange, typ *string
	var payloadBytes *int64
	var rowBytes int64
	var enqueued *time.Time
	if err := rows.Scan(&id, &payloadBytes, &rowBytes, &key, &ev.Payload, &headers, &exchange, &typ, &enqueued); err != nil {
		return ev, 0, fmt.Errorf("read backlog row: %w", err)
	}
	if id == nil {
		return ev, rowBytes, fmt.Errorf("%w: a backlog row has a NULL id", wal.ErrSchema)
	}
	ev.ID = *id
	if enqueued != nil {
		ev.CommitTime = *enqueued
	}
	// An oversize row came without its values (see backfillQuery): as in
	// the stream, it is poison named by its size.
	if reason := oversize(payloadBytes, rowBytes, m.MaxMessageBytes); reason != "" {
		ev.Problem = reason
		return ev, int64(len(ev.ID)), nil
	}
	// As in the stream, a NULL routing key or payload makes the row
	// poison rather than breaking the backfill.
	switch {
	case key == nil:
		ev.Problem = fmt.Sprintf("column %q is NULL", m.RoutingKey)
	case ev.Payload == nil:
		ev.Problem = fmt.Sprintf("column %q is NULL", m.Payload)
	default:
		ev.RoutingKey = *key
	}
	if headers != nil {
		ev.Headers = []byte(*headers)
	}
	if exchange != nil {
		ev.Exchange = *exchange
	}
	if typ != nil {
		ev.Type = *typ
	}
	return ev, rowBytes, nil
}

// oversize says why a row of these sizes is too large to publish, or ""
// when it is not; the wording is the stream decoder's.
func oversize(payloadBytes *int64, rowBytes, limit int64) string {
	if limit <= 0 {
		return ""
	}
	if payloadBytes != nil && *payloadBytes > limit {
		return fmt.Sprintf("payload is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", *payloadBytes, limit)
	}
	if rowBytes > limit {
		return fmt.Sprintf("row is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", rowBytes, limit)
	}
	return ""
}

// backfillQuery selects the mapped columns, NULL for optional columns the
// table lacks, oldest first when the table has enqueued_at. Each row comes
// with its payload's length and its mapped columns' total length in bytes;
// a row above m.MaxMessageBytes comes with its id and lengths only, so an
// oversize row is never sent whole. The payload is rendered as text once
// per row (the OFFSET 0 keeps the planner from inlining, which would
// render it again for every use).
func backfillQuery(ctx context.Context, db *pgx.Conn, m wal.Mapping) (string, error) {
	table := pgx.Identifier{m.Schema, m.Table}.Sanitize()
	rows, err := db.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, table)
	if err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	has := make(map[string]bool, len(cols))
	for _, c := range cols {
		has[c] = true
	}
	for _, req := range []string{m.ID, m.RoutingKey, m.Payload, "published_at"} {
		if !has[req] {
			return "", fmt.Errorf("%w: table %s has no column %q", wal.ErrSchema, table, req)
		}
	}
	text := func(col string) string {
		if col == "" || !has[col] {
			return "NULL::text"
		}
		return pgx.Identifier{col}.Sanitize() + "::text"
	}
	enqueued, order := "NULL::timestamptz", pgx.Identifier{m.ID}.Sanitize()
	if has["enqueued_at"] {
		enqueued, order = "enqueued_at", "enqueued_at, "+order
	}
	rest := "coalesce(octet_length(cdcrelay_payload), 0)"
	for _, col := range []string{m.ID, m.RoutingKey, m.Headers, m.Exchange, m.MessageType} {
		rest += fmt.Sprintf(" + coalesce(octet_length(%s), 0)", text(col))
	}
	fits := "true"
	if m.MaxMessageBytes > 0 {
		fits = fmt.Sprintf("coalesce(cdcrelay_payload_bytes, 0) <= %d AND cdcrelay_row_bytes <= %d", m.MaxMessageBytes, m.MaxMessageBytes)
	}
	when := func(expr string) string { return "CASE WHEN " + fits + " THEN " + expr + " END" }
	return fmt.Sprintf(`SELECT %s, cdcrelay_payload_bytes, cdcrelay_row_bytes, %s, %s, %s, %s, %s, %s FROM %s
CROSS JOIN LATERAL (SELECT cdcrelay_payload, octet_length(cdcrelay_payload) AS cdcrelay_payload_bytes, %s AS cdcrelay_row_bytes
	FROM (SELECT %s AS cdcrelay_payload OFFSET 0) cdcrelay_p OFFSET 0) cdcrelay_s
WHERE published_at IS NULL ORDER BY %s`,
		text(m.ID), when(text(m.RoutingKey)), when("convert_to(cdcrelay_payload, 'UTF8')"), when(text(m.Headers)),
		when(text(m.Exchange)), when(text(m.MessageType)), enqueued, table,
		rest, text(m.Payload), order), nil
}
