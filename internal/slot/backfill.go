package slot

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// backfillBatch is how many rows one FETCH reads: memory stays bounded by
// it plus the publisher's window, whatever the backlog.
const backfillBatch = 500

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
	n := 0
	for {
		rows, err := tx.Query(ctx, fmt.Sprintf("FETCH %d FROM cdcrelay_backfill", backfillBatch))
		if err != nil {
			return n, fmt.Errorf("fetch backlog: %w", err)
		}
		events, err := scanEvents(rows, m, n)
		if err != nil {
			return n, err
		}
		for _, ev := range events {
			ev.Seq, ev.CommitLSN = seq.Event(), c.ConsistentPoint
			select {
			case out <- ev:
			case <-ctx.Done():
				return n, ctx.Err()
			}
			n++
		}
		if len(events) < backfillBatch {
			return n, nil
		}
	}
}

// scanEvents turns one FETCH into events numbered from first.
func scanEvents(rows pgx.Rows, m wal.Mapping, first int) ([]wal.Event, error) {
	defer rows.Close()
	var out []wal.Event
	for rows.Next() {
		ev := wal.Event{Backfill: true}
		var id, key, headers, exchange, typ *string
		var enqueued *time.Time
		if err := rows.Scan(&id, &key, &ev.Payload, &headers, &exchange, &typ, &enqueued); err != nil {
			return nil, fmt.Errorf("read backlog row: %w", err)
		}
		if id == nil {
			return nil, fmt.Errorf("%w: a backlog row has a NULL id", wal.ErrSchema)
		}
		ev.ID = *id
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
		if enqueued != nil {
			ev.CommitTime = *enqueued
		}
		ev.Index = first + len(out)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read backlog: %w", err)
	}
	return out, nil
}

// backfillQuery selects the mapped columns, NULL for optional columns the
// table lacks, oldest first when the table has enqueued_at.
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
	return fmt.Sprintf(`SELECT %s, %s, convert_to(%s, 'UTF8'), %s, %s, %s, %s FROM %s WHERE published_at IS NULL ORDER BY %s`,
		text(m.ID), text(m.RoutingKey), text(m.Payload), text(m.Headers), text(m.Exchange), text(m.MessageType),
		enqueued, table, order), nil
}
