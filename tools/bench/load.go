package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/publish"
)

// routingKey is what every bench event carries but those of the
// partitioned drain; the bench queue is bound with mainBinding, which
// matches it and not the partitioned drain's keys (partKey).
const (
	routingKey  = "bench.order.created"
	mainBinding = "bench.order.#"
)

// maxChannels is the most CDCRELAY_PUBLISH_CHANNELS the relay accepts.
const maxChannels = 64

// keysPerLane is how many routing keys of the partitioned drain each of
// the relay's channels carries.
const keysPerLane = 4

// partKey is the partitioned drain's k-th candidate routing key.
func partKey(k int) string { return "bench.part." + strconv.Itoa(k) }

// laneKeys picks routing keys partKey(0), partKey(1), ... by the lane
// publish.LaneOf gives them with n channels, skipping those of lanes that
// are full, until every lane has perLane keys: lanes[i] are lane i's keys,
// which queue i is bound to, so each of the relay's channels feeds one
// queue and all are equally loaded.
func laneKeys(n, perLane int) ([][]string, error) {
	if n < 1 || perLane < 1 {
		return nil, fmt.Errorf("laneKeys(%d, %d): want n and perLane >= 1", n, perLane)
	}
	lanes := make([][]string, n)
	for k, missing := 0, n*perLane; missing > 0; k++ {
		if k == 1_000_000 {
			return nil, fmt.Errorf("no %d keys for each of %d lanes among %d candidates", perLane, n, k)
		}
		key := partKey(k)
		if i := publish.LaneOf(key, n); len(lanes[i]) < perLane {
			lanes[i] = append(lanes[i], key)
			missing--
		}
	}
	return lanes, nil
}

// interleave lists the lanes' keys round-robin over the lanes (lane 0's
// first key, lane 1's first, ..., lane 0's second, ...), so that events
// dealt round-robin over the list spread evenly over the lanes at every
// point of a backlog.
func interleave(lanes [][]string) []string {
	var out []string
	for j := 0; ; j++ {
		added := false
		for _, keys := range lanes {
			if j < len(keys) {
				out = append(out, keys[j])
				added = true
			}
		}
		if !added {
			return out
		}
	}
}

// payloadExpr builds an outbox payload of about 210 bytes from g: a JSON
// envelope with its own id, an event_type and a W3C trace_context, the
// envelope services typically write (the relay parses it for the type and the
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

// insertKeysSQL is insertSQL with event g's routing key the (g mod
// len)-th of the array $1: events numbered consecutively go round-robin
// over the keys.
const insertKeysSQL = `INSERT INTO event_outbox (routing_key, payload)
	SELECT ($1::text[])[1 + g % cardinality($1::text[])], ` + payloadExpr + `
	FROM generate_series($2::int, $3::int) g
	RETURNING id::text`

// inserter writes outbox rows through one connection with a prepared
// statement, numbering events across calls so payloads differ.
type inserter struct {
	db   *pgx.Conn
	next int
}

const (
	insertStmt     = "bench_insert"
	insertKeysStmt = "bench_insert_keys"
)

func newInserter(ctx context.Context, url string) (*inserter, error) {
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect inserter: %w", err)
	}
	for name, sql := range map[string]string{insertStmt: insertSQL, insertKeysStmt: insertKeysSQL} {
		if _, err := db.Prepare(ctx, name, sql); err != nil {
			_ = db.Close(ctx)
			return nil, fmt.Errorf("prepare insert: %w", err)
		}
	}
	return &inserter{db: db, next: 1}, nil
}

func (in *inserter) close() error { return in.db.Close(context.Background()) }

// insert commits one transaction of n events with routingKey and returns
// their ids and the time COMMIT returned (the statement runs in its own
// implicit transaction, so its completion is the commit's).
func (in *inserter) insert(ctx context.Context, n int) ([]string, time.Time, error) {
	return in.insertKeys(ctx, n, nil)
}

// insertKeys is insert with the events' routing keys taken round-robin
// from keys (the numbering runs across calls, so does the round-robin);
// with no keys, every event has routingKey.
func (in *inserter) insertKeys(ctx context.Context, n int, keys []string) ([]string, time.Time, error) {
	first := in.next
	in.next += n
	stmt, arg := insertStmt, any(routingKey)
	if len(keys) > 0 {
		stmt, arg = insertKeysStmt, keys
	}
	rows, err := in.db.Query(ctx, stmt, arg, first, first+n-1)
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
// It claims drainerBatch rows a tick over a backlog, 400 ev/s at most; at
// a paced rate above that (the standby part's 1,000 ev/s) it is given
// pacedDrainerBatch, as a service at that rate would configure it.
const (
	drainerTick       = 250 * time.Millisecond
	drainerBatch      = 100
	pacedDrainerBatch = 1000
)

// drainSQL claims up to limit unpublished rows, oldest first, marking them
// published in the same statement (autocommit: one statement, one
// transaction per tick, the cheapest form of the drainer there is).
func drainSQL(limit int) string {
	return fmt.Sprintf(`UPDATE event_outbox SET published_at = now()
	WHERE id IN (SELECT id FROM event_outbox WHERE published_at IS NULL
	             ORDER BY enqueued_at LIMIT %d FOR UPDATE SKIP LOCKED)
	RETURNING id::text, routing_key, payload::text`, limit)
}

// drainer polls every drainerTick and publishes each claimed row with
// confirms on one channel (all of a batch in flight, then waits for them).
type drainer struct {
	limit    int // rows claimed per tick
	db       *pgx.Conn
	pub      *confirmPublisher
	exchange string
}

// run polls until ctx ends. The ticker drops ticks while a batch is still
// being published, so a backlog drains at most limit rows per tick.
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
	rows, err := d.db.Query(ctx, drainSQL(d.limit))
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
