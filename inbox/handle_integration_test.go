package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
)

// TestIntegrationHandle runs Handle on a real queue: events in order, a
// late first delivery, per-key order, a duplicate copy, a delivery without message_id and
// a failing handler (both dead-lettered), then retention.
func TestIntegrationHandle(t *testing.T) {
	e := setup(t)
	ib, reg := newInbox(t, e, 0)
	ctx := t.Context()
	e.publish(t, "m1", "orders.1", "0/10", 0)
	e.publish(t, "m2", "orders.1", "0/20", 0)
	e.publish(t, "m3", "orders.1", "0/10", 1) // a first delivery after m2: late
	e.publish(t, "m1", "orders.1", "0/10", 0) // a copy of m1
	e.publish(t, "", "orders.1", "0/30", 0)   // no message_id
	e.publish(t, "m4", "orders.1", "0/40", 0) // its handler fails
	e.publish(t, "m5", "orders.2", "", 0)     // no relay headers
	e.publish(t, "m7", "orders.2", "0/5", 0)  // below orders.1's pairs, but the first of its key
	_, msgs := e.consume(t, 1)
	type want struct {
		res   inbox.Result
		order inbox.Order
		err   error
	}
	wants := []want{
		{inbox.Handled, inbox.OrderFirst, nil},
		{inbox.Handled, inbox.OrderNext, nil},
		{inbox.Handled, inbox.OrderLate, nil},
		{inbox.Duplicate, 0, nil},
		{inbox.Rejected, 0, inbox.ErrNoMessageID},
		{inbox.Rejected, inbox.OrderNext, errBoom},
		{inbox.Handled, inbox.OrderUnknown, nil},
		{inbox.Handled, inbox.OrderFirst, nil},
	}
	runs := 0
	for i, w := range wants {
		d := next(t, msgs)
		var order inbox.Order
		res, err := ib.Handle(ctx, d, "effects", func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			runs++
			order = ev.Order
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			if ev.MessageID == "m4" {
				return errBoom // the effect row rolls back with the claim
			}
			return nil
		})
		if res != w.res || order != w.order || (w.err == nil) != (err == nil) || (w.err != nil && !errors.Is(err, w.err)) {
			t.Errorf("delivery %d (%s): %v, order %v, %v; want %v, order %v, %v", i, d.MessageId, res, order, err, w.res, w.order, w.err)
		}
	}
	if runs != 6 {
		t.Errorf("the handler ran %d times, want 6 (not for the copy nor the delivery without message_id)", runs)
	}
	if got := e.effects(t); len(got) != 5 || got["m1"] != 1 || got["m2"] != 1 || got["m3"] != 1 || got["m5"] != 1 || got["m7"] != 1 {
		t.Errorf("effects %v, want m1, m2, m3, m5 and m7 once each", got)
	}
	waitFor(t, 10*time.Second, "two messages dead-lettered", func() bool { return e.messages(t, e.dlq) == 2 })
	for name, want := range map[string]float64{
		"cdcrelay_inbox_handled_total": 5, "cdcrelay_inbox_duplicates_total": 1,
		"cdcrelay_inbox_handler_errors_total": 1, "cdcrelay_inbox_late_events_total": 1,
	} {
		if got := counter(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	// A consumer shutting down (its context ends) while a handler runs
	// requeues the delivery instead of dead-lettering it.
	e.publish(t, "m6", "orders.1", "0/50", 0)
	hctx, cancel := context.WithCancel(ctx)
	res, err := ib.Handle(hctx, next(t, msgs), "effects", func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		cancel()
		return ctx.Err()
	})
	if res != inbox.Requeued || !errors.Is(err, context.Canceled) {
		t.Errorf("m6 with the context ending: %v, %v; want requeued", res, err)
	}
	d := next(t, msgs)
	if res, err := ib.Handle(ctx, d, "effects", insertEffect); d.MessageId != "m6" || res != inbox.Handled || err != nil {
		t.Errorf("m6 again: %q %v, %v; want m6 handled", d.MessageId, res, err)
	}
	if n := e.messages(t, e.dlq); n != 2 {
		t.Errorf("%d messages dead-lettered, want still 2", n)
	}

	// Retention deletes done rows older than what it keeps, and only those.
	if _, err := e.conn.Exec(ctx, `UPDATE cdcrelay_inbox SET done_at = now() - interval '2 hours' WHERE message_id IN ('m1', 'm2')`); err != nil {
		t.Fatal(err)
	}
	n, err := ib.Purge(ctx, time.Hour)
	if err != nil || n != 2 {
		t.Fatalf("Purge = %d, %v; want 2 rows", n, err)
	}
	var left int
	if err := e.conn.QueryRow(ctx, `SELECT count(*) FROM cdcrelay_inbox`).Scan(&left); err != nil || left != 4 {
		t.Errorf("%d ledger rows left (%v), want 4 (m3, m5, m6, m7)", left, err)
	}
	if got := counter(t, reg, "cdcrelay_inbox_purged_rows_total"); got != 2 {
		t.Errorf("cdcrelay_inbox_purged_rows_total = %v, want 2", got)
	}

	// RunRetention purges on its own until its context ends.
	if _, err := e.conn.Exec(ctx, `UPDATE cdcrelay_inbox SET done_at = now() - interval '2 hours' WHERE message_id = 'm3'`); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- ib.RunRetention(rctx, 50*time.Millisecond, time.Hour) }()
	waitFor(t, 10*time.Second, "RunRetention purged m3", func() bool { return counter(t, reg, "cdcrelay_inbox_purged_rows_total") == 3 })
	stop()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("RunRetention returned %v, want context.Canceled", err)
	}
}

var errBoom = errors.New("boom")

// TestIntegrationTwoConsumersRunOnce: two consumers on one queue; the
// consumer running the handler loses its connection, so the broker
// redelivers the message to the other while the handler still runs. The
// handler runs once, and the redelivered copy is acked as a duplicate.
func TestIntegrationTwoConsumersRunOnce(t *testing.T) {
	for _, mode := range []string{"tx", "effect"} {
		t.Run(mode, func(t *testing.T) {
			e := setup(t)
			ibA, regA := newInbox(t, e, 3*time.Second)
			ibB, regB := newInbox(t, e, 3*time.Second)
			connA, msgsA := e.consume(t, 1)
			connB, msgsB := e.consume(t, 1)
			ibs, regs := []*inbox.Inbox{ibA, ibB}, []*prometheus.Registry{regA, regB}
			conns, chans := []*amqp.Connection{connA, connB}, []<-chan amqp.Delivery{msgsA, msgsB}
			e.publish(t, "m1", "orders.1", "0/10", 0)

			started, release := make(chan struct{}), make(chan struct{})
			var runs atomic.Int32
			run := func() {
				if runs.Add(1) == 1 {
					close(started)
				}
				<-release
			}
			type outcome struct {
				res inbox.Result
				err error
			}
			handle := func(ib *inbox.Inbox, d amqp.Delivery, out chan<- outcome) {
				ctx := context.Background()
				var o outcome
				if mode == "tx" {
					o.res, o.err = ib.Handle(ctx, d, "effects", func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
						run()
						return insertEffect(ctx, tx, ev)
					})
				} else {
					o.res, o.err = ib.HandleEffect(ctx, d, "effects", func(_ context.Context, ev inbox.Event) error {
						run()
						_, err := e.conn.Exec(context.Background(), `INSERT INTO effects (message_id, attempt) VALUES ($1, $2)`, ev.MessageID, ev.Attempt)
						return err
					})
				}
				out <- o
			}
			// Whichever consumer gets the message runs the handler; its
			// connection is then closed and the other gets the copy.
			var i int
			var d amqp.Delivery
			select {
			case d = <-msgsA:
			case d = <-msgsB:
				i = 1
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery")
			}
			j := 1 - i
			first, second := make(chan outcome, 1), make(chan outcome, 1)
			go handle(ibs[i], d, first)
			<-started
			if err := conns[i].Close(); err != nil {
				t.Fatal(err)
			}
			d2 := next(t, chans[j])
			if !d2.Redelivered || d2.MessageId != "m1" {
				t.Errorf("the other consumer got %q, redelivered %v; want m1 redelivered", d2.MessageId, d2.Redelivered)
			}
			go handle(ibs[j], d2, second)
			// The copy waits for the first claim: on its transaction (tx),
			// or on its live lease (effect).
			select {
			case o := <-second:
				t.Fatalf("the copy finished while the first handler ran: %v, %v", o.res, o.err)
			case <-time.After(time.Second):
			}
			close(release)
			o1, o2 := <-first, <-second
			if o1.res != inbox.Handled || o1.err == nil {
				t.Errorf("first: %v, %v; want handled, and an error for the ack on the closed connection", o1.res, o1.err)
			}
			if o2.res != inbox.Duplicate || o2.err != nil {
				t.Errorf("second: %v, %v; want duplicate", o2.res, o2.err)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want once", n)
			}
			if got := e.effects(t); got["m1"] != 1 || len(got) != 1 {
				t.Errorf("effects %v, want m1 once", got)
			}
			if got := counter(t, regs[i], "cdcrelay_inbox_handled_total"); got != 1 {
				t.Errorf("first consumer handled %v, want 1", got)
			}
			if got := counter(t, regs[j], "cdcrelay_inbox_duplicates_total"); got != 1 {
				t.Errorf("second consumer counted %v duplicates, want 1", got)
			}
			if n := e.messages(t, e.queue); n != 0 {
				t.Errorf("%d messages left in the queue", n)
			}
		})
	}
}
