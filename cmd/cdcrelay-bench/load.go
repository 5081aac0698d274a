package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// routingKey is what every bench event carries; the bench queue is bound
// with "#".
const routingKey = "bench.order.created"

// payloadExpr builds an outbox payload of about 210 bytes from g: a JSON
// envelope with its own id, an event_type and a W3C trace_context, the
// shape DESIGN.md describes (the relay parses it for the type and the
// traceparent, so the bench exercises that path).
const payloadExpr = `jsonb_build_object(
	'id', md5('evt' || g)::uuid,
	'event_type', 'OrderCreated',
	'trace_context', '00-' || md5('trace' || g) || '-' || left(md5('span' || g), 16) || '-01',
	'data', jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % 997)))`

// insertSQL inserts the events numbered $2..$3 in one statement (and, run
// on its own, one transaction) and returns their outbox ids.
const insertSQL = `INSERT INTO event_outbox (routing_key, payload)
	SELECT $1, ` + payloadExpr + `
	FROM generate_series($2::int, $3::int) g
	RETURNING id::text`

// inserter writes outbox rows through one connection with a prepared
// statement, numbering events across calls so payloads differ.
type inserter struct {
	db   *pgx.Conn
	next int
}

const insertStmt = "bench_insert"

func newInserter(ctx context.Context, url string) (*inserter, error) {
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect inserter: %w", err)
	}
	if _, err := db.Prepare(ctx, insertStmt, insertSQL); err != nil {
		_ = db.Close(ctx)
		return nil, fmt.Errorf("prepare insert: %w", err)
	}
	return &inserter{db: db, next: 1}, nil
}

func (in *inserter) close() error { return in.db.Close(context.Background()) }

// insert commits one transaction of n events and returns their ids and the
// time COMMIT returned (the statement runs in its own implicit
// transaction, so its completion is the commit's).
func (in *inserter) insert(ctx context.Context, n int) ([]string, time.Time, error) {
	first := in.next
	in.next += n
	rows, err := in.db.Query(ctx, insertStmt, routingKey, first, first+n-1)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("insert %d events: %w", n, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	committed := time.Now()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("insert %d events: %w", n, err)
	}
	return ids, committed, nil
}

// samplePayload is the payload of event g as the relay will publish it
// (jsonb's text form), for the reference publisher's bodies.
func samplePayload(ctx context.Context, db *pgx.Conn, g int) (body []byte, traceparent string, err error) {
	err = db.QueryRow(ctx, `SELECT p::text, p->>'trace_context' FROM (SELECT `+payloadExpr+` AS p FROM (SELECT $1::int AS g) s) t`, g).
		Scan(&body, &traceparent)
	if err != nil {
		return nil, "", fmt.Errorf("sample payload: %w", err)
	}
	return body, traceparent, nil
}

// pacer calls fn on a fixed schedule: tick i is due at start + i*interval.
// A late tick runs at once (so short hiccups are caught up), but when the
// caller falls more than maxLag behind, the schedule is moved rather than
// caught up in a burst: the achieved rate then shows the shortfall.
type pacer struct {
	interval time.Duration
	maxLag   time.Duration
}

// run ticks until d has passed or fn fails; it returns the ticks run and
// the time they took.
func (p pacer) run(ctx context.Context, d time.Duration, fn func(i int) error) (int, time.Duration, error) {
	start := time.Now()
	base := start
	for i := 0; ; i++ {
		due := base.Add(time.Duration(i) * p.interval)
		if due.Sub(start) >= d {
			return i, time.Since(start), nil
		}
		if wait := time.Until(due); wait > 0 {
			select {
			case <-ctx.Done():
				return i, time.Since(start), ctx.Err()
			case <-time.After(wait):
			}
		} else if -wait > p.maxLag {
			base = time.Now().Add(-time.Duration(i) * p.interval)
		}
		if err := fn(i); err != nil {
			return i, time.Since(start), err
		}
	}
}

// Polling drainer baseline: what services run today and want to retire.
const (
	drainerTick  = 250 * time.Millisecond
	drainerBatch = 100
)

// drainSQL claims up to drainerBatch unpublished rows, oldest first,
// marking them published in the same statement (autocommit: one statement,
// one transaction per tick, the cheapest form of the drainer there is).
var drainSQL = fmt.Sprintf(`UPDATE event_outbox SET published_at = now()
	WHERE id IN (SELECT id FROM event_outbox WHERE published_at IS NULL
	             ORDER BY enqueued_at LIMIT %d FOR UPDATE SKIP LOCKED)
	RETURNING id::text, routing_key, payload::text`, drainerBatch)

// drainer polls every drainerTick and publishes each claimed row with
// confirms on one channel (all of a batch in flight, then waits for them).
type drainer struct {
	db       *pgx.Conn
	pub      *confirmPublisher
	exchange string
}

// run polls until ctx ends. The ticker drops ticks while a batch is still
// being published, so a backlog drains at most drainerBatch per tick.
func (d *drainer) run(ctx context.Context) error {
	tick := time.NewTicker(drainerTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := d.batch(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

type outboxRow struct {
	ID, RoutingKey, Payload string
}

func (d *drainer) batch(ctx context.Context) error {
	rows, err := d.db.Query(ctx, drainSQL)
	if err != nil {
		return fmt.Errorf("drainer poll: %w", err)
	}
	batch, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	if err != nil {
		return fmt.Errorf("drainer poll: %w", err)
	}
	for i, r := range batch {
		msg := amqp.Publishing{
			Headers:      amqp.Table{"cdcrelay-tx-index": int64(i)},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    r.ID,
			Timestamp:    time.Now(),
			Type:         "OrderCreated",
			Body:         []byte(r.Payload),
		}
		if err := d.pub.publish(ctx, d.exchange, r.RoutingKey, msg); err != nil {
			return err
		}
	}
	return d.pub.wait(ctx)
}
