package adoption

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// A FETCH asks for at most backfillBatch rows and aims at about
// backfillFetchBytes: it starts at backfillFirstFetch rows and grows (at
// most fourfold per FETCH) while the rows are small, shrinking at once when
// they are large. Memory does not depend on it: rows are handed on one at
// a time as they arrive (see fetchBackfill). A FETCH of a few MiB keeps
// the server rendering the next rows while the relay hands on the current
// one (a FETCH per large row left each side idle half the time), ends
// soon enough that the statement is not held open for long behind a slow
// broker, and small rows still come 500 to a round trip.
const (
	backfillBatch      = 500
	backfillFirstFetch = 16
	backfillFetchBytes = 4 << 20
)

// Sequencer assigns the events' sequence numbers (progress.Watermark does).
type Sequencer interface{ NextSeq() uint64 }

// Backfill reads every row with published_at IS NULL from the slot's
// exported snapshot, oldest first, and sends each to out as an event. The
// snapshot holds exactly the rows committed before the slot's consistent
// point; everything after is in the slot's stream, so together they leave
// no gap. When c names no snapshot, a new one is taken: it holds those
// rows too, and the rows committed since, which the stream sends again. Events carry the slot's consistent point as commit LSN and their
// position in the backfill as index: every row was committed before that
// point and every streamed transaction commits after it, so consumers see
// one order. out is closed when Backfill returns.
//
// Memory is bounded by bytes, not rows (invariant 6, docs/architecture.md):
// each row is sent to out as soon as it is read, before the next is read,
// so Backfill holds one row whatever its neighbours' sizes, and out's
// reader takes the byte budget. A row larger than m.MaxMessageBytes is
// judged from its length in the database and read without its values: it
// becomes a poison event with a Problem naming its size.
//
// total, if not nil, is told first how many rows the snapshot holds to
// publish (counted in the same snapshot): with the events sent since, the
// adoption's progress and what is left.
func Backfill(ctx context.Context, db *pgx.Conn, c slot.Created, m wal.Mapping, seq Sequencer, out chan<- wal.Event, total func(int64)) (int, error) {
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
	// Without an exported snapshot (an adoption resumed on a slot that
	// never streamed) the transaction's own snapshot, taken after the
	// slot's consistent point, holds every row committed before it too.
	if c.Snapshot != "" {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", strings.ReplaceAll(c.Snapshot, "'", "''"))); err != nil {
			return 0, fmt.Errorf("import slot snapshot: %w", err)
		}
	}
	// The transaction sits idle while the publisher waits for the broker or
	// for room in the byte budget: a role's idle-in-transaction timeout must
	// not end an adoption that is only waiting.
	if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = 0"); err != nil {
		return 0, fmt.Errorf("backfill: %w", err)
	}
	if total != nil {
		var rows int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{m.Schema, m.Table}.Sanitize()+" WHERE published_at IS NULL").Scan(&rows); err != nil {
			return 0, fmt.Errorf("count the backlog: %w", err)
		}
		total(rows)
	}
	if _, err := tx.Exec(ctx, "DECLARE cdcrelay_backfill NO SCROLL CURSOR FOR "+query); err != nil {
		return 0, fmt.Errorf("declare backfill cursor: %w", err)
	}
	n, count := 0, backfillFirstFetch
	at := snapshotLSN(c.ConsistentPoint)
	send := func(ev wal.Event) error {
		ev.Seq, ev.CommitLSN, ev.Index = seq.NextSeq(), at, c.FirstIndex+n
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
// read. The pgtype destinations scan without reflection: this runs once
// per row of a backlog that can hold millions.
func scanEvent(rows pgx.Rows, m wal.Mapping) (wal.Event, int64, error) {
	ev := wal.Event{Backfill: true}
	var id, key, headers, exchange, typ pgtype.Text
	var payloadBytes, rowBytes pgtype.Int8
	var enqueued pgtype.Timestamptz
	if err := rows.Scan(&id, &payloadBytes, &rowBytes, &key, &ev.Payload, &headers, &exchange, &typ, &enqueued); err != nil {
		return ev, 0, fmt.Errorf("read backlog row: %w", err)
	}
	if !id.Valid {
		return ev, 0, fmt.Errorf("%w: a backlog row has a NULL id", wal.ErrSchema)
	}
	ev.ID = id.String
	if enqueued.Valid {
		ev.CommitTime = enqueued.Time
	}
	// An oversize row came with its sizes instead of its values (see
	// backfillQuery): as in the stream, it is poison named by its size.
	if rowBytes.Valid {
		ev.Problem = oversize(payloadBytes.Int64, rowBytes.Int64, m.MaxMessageBytes)
		return ev, int64(len(ev.ID)), nil
	}
	// As in the stream, a NULL routing key or payload makes the row
	// poison rather than breaking the backfill.
	switch {
	case !key.Valid:
		ev.Problem = fmt.Sprintf("column %q is NULL", m.RoutingKeyColumn)
	case ev.Payload == nil:
		ev.Problem = fmt.Sprintf("column %q is NULL", m.PayloadColumn)
	default:
		ev.RoutingKey = key.String
	}
	if headers.Valid {
		ev.Headers = []byte(headers.String)
	}
	ev.Exchange, ev.Type = exchange.String, typ.String
	return ev, int64(ev.Size()), nil
}

// oversize says why a row of these sizes is too large to publish, in the
// stream decoder's words.
func oversize(payloadBytes, rowBytes, limit int64) string {
	if payloadBytes > limit {
		return fmt.Sprintf("payload is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", payloadBytes, limit)
	}
	return fmt.Sprintf("row is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", rowBytes, limit)
}

// backfillQuery selects the mapped columns (see backfillSQL) of the
// table, after checking it has the required ones.
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
	for _, req := range []string{m.IDColumn, m.RoutingKeyColumn, m.PayloadColumn, "published_at"} {
		if !has[req] {
			return "", fmt.Errorf("%w: table %s has no column %q", wal.ErrSchema, table, req)
		}
	}
	return backfillSQL(table, m, has), nil
}

// backfillSQL selects the unpublished rows of table (whose columns are
// has), oldest first when it has enqueued_at, then by id as text: id,
// payload length, total length, routing key, payload, headers, exchange,
// type, enqueued_at; NULL for optional columns the table lacks.
//
// A row whose mapped columns add up to more than m.MaxMessageBytes comes
// with its id and lengths only, so an oversize row is never sent whole;
// any other row comes without lengths. o is the backlog in order, sorted
// before anything is rendered, so the sort holds stored values, not their
// rendering; r renders each column as text once (i(d), k(ey), p(ayload),
// h(eaders), e(xchange), t(ype)); v adds n, their total length. Each
// OFFSET 0 keeps the planner from inlining a level, which would render a
// jsonb payload again for every use of its length. Every value comes as
// text in the connection's client_encoding, UTF8 on every relay connection
// (pgconnect), which is also what pgoutput converts the stream to: both
// paths carry the same bytes whatever the database encoding.
func backfillSQL(table string, m wal.Mapping, has map[string]bool) string {
	inner, outer, enqueued := "cdcrelay_id", "o.cdcrelay_id", "NULL::timestamptz"
	if has["enqueued_at"] {
		inner, outer, enqueued = "enqueued_at, "+inner, "o.enqueued_at, "+outer, "o.enqueued_at"
	}
	names := []string{"i", "k", "p", "h", "e", "t"}
	rendered, sizes := []string{"o.cdcrelay_id AS i"}, []string{"coalesce(octet_length(r.i), 0)"}
	for i, col := range []string{m.RoutingKeyColumn, m.PayloadColumn, m.HeadersColumn, m.ExchangeColumn, m.TypeColumn} {
		expr := "NULL::text"
		if col != "" && has[col] {
			expr = "o." + pgx.Identifier{col}.Sanitize() + "::text"
		}
		rendered = append(rendered, expr+" AS "+names[i+1])
		sizes = append(sizes, "coalesce(octet_length(r."+names[i+1]+"), 0)")
	}
	fits := "true"
	if m.MaxMessageBytes > 0 {
		fits = fmt.Sprintf("v.n <= %d", m.MaxMessageBytes)
	}
	when := func(expr string) string { return "CASE WHEN " + fits + " THEN " + expr + " END" }
	unless := func(expr string) string { return "CASE WHEN " + fits + " THEN NULL ELSE " + expr + " END" }
	return fmt.Sprintf(`SELECT v.i, %s, %s, %s, %s, %s, %s, %s, %s
FROM (SELECT *, %s::text AS cdcrelay_id FROM %s WHERE published_at IS NULL ORDER BY %s OFFSET 0) o
CROSS JOIN LATERAL (SELECT r.*, (%s)::bigint AS n FROM (SELECT %s OFFSET 0) r OFFSET 0) v
ORDER BY %s`,
		unless("octet_length(v.p)::bigint"), unless("v.n"),
		when("v.k"), when("v.p"), when("v.h"), when("v.e"), when("v.t"), enqueued,
		pgx.Identifier{m.IDColumn}.Sanitize(), table, inner,
		strings.Join(sizes, " + "), strings.Join(rendered, ", "), outer)
}

// snapshotLSN is the commit LSN a new slot's snapshot rows carry: the LSN
// just before the slot's consistent point. Every snapshot row committed
// before that point, and the stream holds exactly the transactions whose
// commit record starts at or after it, so (snapshotLSN, index) sorts after
// every event streamed from an earlier slot and strictly before every event
// streamed from this one, including a transaction whose commit record
// starts exactly at the consistent point. No WAL record starts there (a
// record is at least 24 bytes long and the one before ends at the
// consistent point), so no streamed transaction has it as its commit LSN
// (invariant 12, docs/architecture.md; docs/messages.md).
func snapshotLSN(consistentPoint pglogrepl.LSN) pglogrepl.LSN { return consistentPoint - 1 }
