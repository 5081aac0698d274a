package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DB is where the ledger lives: a *pgxpool.Pool, or a *pgx.Conn when the
// Inbox is used from one goroutine at a time. HandleEffect renews its lease
// while the handler runs, on a transaction of its own: give it a pool if
// the handler uses the same database.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Options tunes an Inbox. The zero value of each field is a sensible
// default, except Registerer, which may be nil to register no metrics.
type Options struct {
	// Logger receives one line per failure; nil discards.
	Logger *slog.Logger
	// Registerer receives the inbox metrics (docs/consumers.md); nil
	// registers none.
	Registerer prometheus.Registerer
	// Lease is how long a HandleEffect claim is held without renewal
	// (renewed every third of it while the handler runs). Default 30 s.
	Lease time.Duration
	// PollInterval bounds how long HandleEffect waits between looks at a
	// claim another consumer holds. Default 1 s, at most Lease/4.
	PollInterval time.Duration
}

// Inbox claims deliveries in the ledger and acks them. It is safe for
// concurrent use when its DB is.
type Inbox struct {
	db      DB
	log     *slog.Logger
	metrics *metrics
	lease   time.Duration
	poll    time.Duration
}

// New returns an Inbox on db. The ledger must exist (Migrate).
func New(db DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox: no database")
	}
	ib := &Inbox{db: db, log: opts.Logger, lease: opts.Lease, poll: opts.PollInterval}
	if ib.log == nil {
		ib.log = slog.New(slog.DiscardHandler)
	}
	if ib.lease <= 0 {
		ib.lease = 30 * time.Second
	}
	if ib.poll <= 0 {
		ib.poll = time.Second
	}
	ib.poll = min(ib.poll, ib.lease/4)
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	ib.metrics = m
	return ib, nil
}

// Event is what a handler gets: the delivery and what the inbox knows
// about it.
type Event struct {
	// Delivery is the AMQP delivery (body, headers, properties). The
	// inbox acks or nacks it: the handler must not.
	Delivery *amqp.Delivery
	// MessageID is the delivery's message_id: the outbox row's id.
	MessageID string
	// Handler is the handler name the delivery was claimed for.
	Handler string
	// Position is the relay's (timeline, commit LSN, index).
	Position Position
	// Order places the event among its routing key's events.
	Order Order
	// Attempt is 1, or with HandleEffect the number of claims taken on
	// this message: above 1, an earlier attempt may have had some of its
	// effects before it failed or crashed.
	Attempt int
}

// TxHandler applies one event's effects in tx, which also holds the claim.
// It must not commit or roll back tx.
type TxHandler func(ctx context.Context, tx pgx.Tx, ev Event) error

// Result is what became of a delivery.
type Result int

const (
	// Handled: the handler ran and its claim is done; acked.
	Handled Result = iota
	// Duplicate: a copy whose claim was already done; acked without
	// running the handler.
	Duplicate
	// Rejected: nacked without requeue (no message_id, a handler error):
	// the queue's dead-letter exchange receives it.
	Rejected
	// Requeued: nacked with requeue (a Requeue error, the inbox's own
	// database failing, the context ending).
	Requeued
)

func (r Result) String() string {
	return [...]string{"handled", "duplicate", "rejected", "requeued"}[r]
}

var (
	// ErrNoMessageID is returned for a delivery without message_id, which
	// the inbox cannot deduplicate: it is nacked without requeue.
	ErrNoMessageID = errors.New("inbox: delivery has no message_id (nacked without requeue, to the dead-letter exchange)")
	// ErrLeaseLost is returned by HandleEffect when another consumer took
	// the claim over while the handler ran (its lease expired without
	// renewal): the handler may have run twice.
	ErrLeaseLost = errors.New("inbox: the claim's lease was lost to another consumer")
	// ErrClaimedByEffect is returned by Handle when the message is claimed
	// under the same handler name by HandleEffect: a handler name belongs
	// to one of the two.
	ErrClaimedByEffect = errors.New("inbox: the message is claimed by HandleEffect under the same handler name")
)

// requeueError marks a handler error whose delivery goes back to the queue.
type requeueError struct{ err error }

func (e requeueError) Error() string { return e.err.Error() }
func (e requeueError) Unwrap() error { return e.err }

// Requeue wraps a handler error so the delivery is nacked with requeue
// (tried again, by this or another consumer) instead of dead-lettered: for
// a failure that is not the message's fault.
func Requeue(err error) error {
	if err == nil {
		return nil
	}
	return requeueError{err}
}

func wantsRequeue(err error) bool {
	var r requeueError
	return errors.As(err, &r)
}

// Handle processes a delivery with a handler whose effects are in the
// ledger's database: in one transaction it claims (message_id, handler)
// and runs fn, then commits, then acks. A copy whose claim is committed is
// acked without running fn (a concurrent copy waits for the first one's
// transaction on the ledger's primary key, then is a duplicate, or claims
// if that transaction rolled back).
func (ib *Inbox) Handle(ctx context.Context, d amqp.Delivery, handler string, fn TxHandler) (Result, error) {
	if err := check(d, handler); err != nil {
		return ib.reject(d, handler, err)
	}
	ev := Event{Delivery: &d, MessageID: d.MessageId, Handler: handler, Position: PositionOf(d.Headers), Attempt: 1}
	tx, err := ib.db.Begin(ctx)
	if err != nil {
		return ib.requeue(d, handler, fmt.Errorf("inbox: begin: %w", err))
	}
	// After a commit the rollback is a no-op.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, `INSERT INTO cdcrelay_inbox
		(message_id, handler, state, routing_key, commit_lsn, tx_index, done_at)
		VALUES ($1, $2, 'done', $3, $4::pg_lsn, $5, now())
		ON CONFLICT (message_id, handler) DO NOTHING`,
		d.MessageId, handler, d.RoutingKey, lsnArg(ev.Position), indexArg(ev.Position))
	if err != nil {
		return ib.requeue(d, handler, fmt.Errorf("inbox: claim %s for %s: %w", d.MessageId, handler, err))
	}
	if tag.RowsAffected() == 0 {
		var state string
		if err := tx.QueryRow(ctx, `SELECT state FROM cdcrelay_inbox WHERE message_id = $1 AND handler = $2`,
			d.MessageId, handler).Scan(&state); err != nil {
			return ib.requeue(d, handler, fmt.Errorf("inbox: read the claim of %s for %s: %w", d.MessageId, handler, err))
		}
		if state != "done" {
			return ib.requeue(d, handler, fmt.Errorf("%w: %s for %s", ErrClaimedByEffect, d.MessageId, handler))
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return ib.duplicate(d, handler)
	}
	if ev.Order, err = advanceOrder(ctx, tx, handler, &d, ev.Position); err != nil {
		return ib.requeue(d, handler, err)
	}
	if err := fn(ctx, tx, ev); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return ib.handlerFailed(ctx, d, handler, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// Committed or not, the ledger decides on the redelivery.
		return ib.requeue(d, handler, fmt.Errorf("inbox: commit %s for %s: %w", d.MessageId, handler, err))
	}
	return ib.handled(d, handler, ev.Order)
}

// check refuses what the ledger cannot key.
func check(d amqp.Delivery, handler string) error {
	if handler == "" {
		return errors.New("inbox: empty handler name (nacked without requeue)")
	}
	if d.MessageId == "" {
		return ErrNoMessageID
	}
	return nil
}

func lsnArg(p Position) any {
	if !p.Valid {
		return nil
	}
	return p.LSNText()
}

func indexArg(p Position) any {
	if !p.Valid {
		return nil
	}
	return p.TxIndex
}

// timelineArg is the position's timeline for the ledger, NULL when the
// message carried none.
func timelineArg(p Position) any {
	if !p.Valid || p.Timeline == 0 {
		return nil
	}
	return int64(p.Timeline)
}

// advanceOrder classifies the event against the greatest position claimed
// for its handler and routing key and records its own if greater. The row
// lock (FOR UPDATE, or the insert's) serialises the claims of one key, so
// two events of a key are classified one after the other.
func advanceOrder(ctx context.Context, tx pgx.Tx, handler string, d *amqp.Delivery, pos Position) (Order, error) {
	if !pos.Valid {
		return OrderUnknown, nil
	}
	var seen Position
	var lsnText string
	var timeline *int64
	err := tx.QueryRow(ctx, `SELECT timeline, commit_lsn::text, tx_index FROM cdcrelay_inbox_order
		WHERE handler = $1 AND routing_key = $2 FOR UPDATE`, handler, d.RoutingKey).Scan(&timeline, &lsnText, &seen.TxIndex)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return OrderUnknown, fmt.Errorf("inbox: read the order of key %q for %s: %w", d.RoutingKey, handler, err)
	default:
		if seen.CommitLSN, err = parseLSN(lsnText); err != nil {
			return OrderUnknown, fmt.Errorf("inbox: the order of key %q for %s: %w", d.RoutingKey, handler, err)
		}
		if timeline != nil {
			seen.Timeline = timelineOf(*timeline, true)
		}
		seen.Valid = true
	}
	order := classify(pos, seen)
	if order == OrderLate {
		return order, nil
	}
	// Two first events of a key racing: the second waits on the first's
	// insert, then updates only if its position is not below the first's,
	// by Position.Less: timelines first when both have one.
	if _, err := tx.Exec(ctx, `INSERT INTO cdcrelay_inbox_order AS o (handler, routing_key, commit_lsn, tx_index, message_id, timeline)
		VALUES ($1, $2, $3::pg_lsn, $4, $5, $6)
		ON CONFLICT (handler, routing_key) DO UPDATE
		SET timeline = EXCLUDED.timeline, commit_lsn = EXCLUDED.commit_lsn, tx_index = EXCLUDED.tx_index,
			message_id = EXCLUDED.message_id, updated_at = now()
		WHERE CASE WHEN o.timeline IS NOT NULL AND EXCLUDED.timeline IS NOT NULL AND o.timeline <> EXCLUDED.timeline
			THEN o.timeline < EXCLUDED.timeline
			ELSE (o.commit_lsn, o.tx_index) <= (EXCLUDED.commit_lsn, EXCLUDED.tx_index) END`,
		handler, d.RoutingKey, pos.LSNText(), pos.TxIndex, d.MessageId, timelineArg(pos)); err != nil {
		return OrderUnknown, fmt.Errorf("inbox: record the order of key %q for %s: %w", d.RoutingKey, handler, err)
	}
	return order, nil
}
