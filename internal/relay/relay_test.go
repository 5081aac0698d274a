package relay_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

const slotName = "cdcrelay_outbox"

// TestIntegrationExactlyOnceInCommitOrder: 10,000 events in transactions of
// 1, 10 and 500 rows, interleaved, arrive exactly once, in commit order, and
// the slot ends past the last commit.
func TestIntegrationExactlyOnceInCommitOrder(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)

	var sizes []int
	for i := range 1000 {
		sizes = append(sizes, 1)
		if i%100 == 0 {
			sizes = append(sizes, 500) // 10 of these
		}
		if i%5 == 0 {
			sizes = append(sizes, 10, 10) // 400 of these
		}
	}
	rows, last := insertTxns(t, e.db, "orders.created", sizes...)
	if len(rows) != 10000 {
		t.Fatalf("inserted %d rows", len(rows))
	}
	testenv.WaitCount(t, e.consumer, len(rows), 2*time.Minute)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatalf("relay: %v", err)
	}
	// Stragglers, duplicates among them, would be in the queue before the
	// barrier.
	if dups := report(t, rows, e.brokerBarrier(t, "orders.created")); dups != 0 {
		t.Fatalf("%d duplicates in a run without faults", dups)
	}
}

// TestIntegrationSIGKILLMidStream kills the relay process while 5,000 events
// stream, starts it again and checks that every event arrives.
func TestIntegrationSIGKILLMidStream(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	p := e.startProcess(nil)
	testenv.WaitSlotActive(t, e.db, slotName, 30*time.Second)

	type result struct {
		rows []row
		err  error
	}
	inserted := make(chan result, 1)
	db := e.connect()
	go func() {
		var all []row
		for range 100 {
			rs, _, err := insert(context.Background(), db, "stream", 50)
			all = append(all, rs...)
			if err != nil {
				inserted <- result{all, err}
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		inserted <- result{all, nil}
	}()
	testenv.WaitCount(t, e.consumer, 1000, time.Minute)
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 10*time.Second); isExit(err, 0) {
		t.Fatal("relay exited cleanly after SIGKILL")
	}
	killedAt := e.consumer.Count()
	p = e.startProcess(nil)
	res := <-inserted
	if res.err != nil {
		t.Fatalf("insert: %v", res.err)
	}
	rows := res.rows
	waitAll(t, e.consumer, rows, 2*time.Minute)

	// A graceful stop exits 0.
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 30*time.Second); !isExit(err, 0) {
		t.Fatalf("relay exit after SIGTERM: %v", err)
	}
	dups := report(t, rows, e.consumer.Deliveries())
	t.Logf("SIGKILL after %d deliveries: %d events, 0 missing, %d duplicates", killedAt, len(rows), dups)
}

// TestIntegrationInsertedWhileDown: rows committed while no relay runs are
// published when it starts again.
func TestIntegrationInsertedWhileDown(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	before, beforeLast := insertTxns(t, e.db, "k", 3)
	testenv.WaitCount(t, e.consumer, 3, 30*time.Second)
	// Delivered is not yet received whole: on a busy machine the stop can
	// come between the transaction's rows and its commit message, and a
	// graceful stop confirms only what it received. Wait for the slot.
	testenv.WaitConfirmed(t, e.db, slotName, beforeLast+1, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	during, last := insertTxns(t, e.db, "k", 1, 10, 100)
	if n := len(e.brokerBarrier(t, "k")); n != 3 {
		t.Fatalf("%d deliveries while the relay was down", n)
	}
	e.startRelay(nil)
	all := append(append([]row(nil), before...), during...)
	testenv.WaitCount(t, e.consumer, len(all)+1, time.Minute) // and the barrier
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	if dups := report(t, all, e.relayed()); dups != 0 {
		t.Fatalf("%d duplicates after a graceful stop", dups)
	}
}

// TestIntegrationIdleSlotAdvances: with nothing in flight and writes only to
// another table, keepalives move the slot (invariant 2, docs/architecture.md).
func TestIntegrationIdleSlotAdvances(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `CREATE TABLE other (id serial primary key, v text)`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	r.waitStreaming(t)
	start := testenv.ConfirmedFlush(t, e.db, slotName)
	for range 20 {
		if _, err := e.db.Exec(ctx, `INSERT INTO other (v) SELECT repeat('x', 1000) FROM generate_series(1, 100)`); err != nil {
			t.Fatal(err)
		}
	}
	var after uint64
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	testenv.WaitConfirmed(t, e.db, slotName, pglsn(after), 30*time.Second)
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got <= start {
		t.Fatalf("slot did not move: %s", got)
	}
	if n := e.consumer.Count(); n != 0 {
		t.Fatalf("%d messages published for writes to another table", n)
	}
}

// TestIntegrationWatermarkWaitsForConfirms holds the broker's confirms back
// in a TCP proxy: the messages reach the queue, but the slot must not move
// past their transaction until the confirms reach the relay.
func TestIntegrationWatermarkWaitsForConfirms(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	amqpViaProxy := "amqp://guest:guest@" + proxy.Addr() + "/"
	r := e.startRelay(map[string]string{"AMQP_URL": amqpViaProxy, "AMQP_HEARTBEAT": "30s"})
	r.waitStreaming(t)
	time.Sleep(500 * time.Millisecond) // let idle keepalives settle

	proxy.HoldDownstream(true)
	rows, last := insertTxns(t, e.db, "held", 20)
	testenv.WaitCount(t, e.consumer, len(rows), 30*time.Second) // the broker has them
	before := testenv.ConfirmedFlush(t, e.db, slotName)
	if before > last {
		t.Fatalf("slot at %s before any confirm, past the held transaction (%s)", before, last)
	}
	// Keepalives keep coming; the slot must stay behind the transaction.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if got := testenv.ConfirmedFlush(t, e.db, slotName); got > last {
			t.Fatalf("slot moved to %s past the unconfirmed transaction (%s)", got, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	proxy.HoldDownstream(false)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	if dups := report(t, rows, e.consumer.Deliveries()); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}

// TestIntegrationReturnedMessageBlocksTheSlot: an unroutable message is a
// failure; the slot stays before it and the relay retries until a binding
// appears, then delivers it.
func TestIntegrationReturnedMessageBlocksTheSlot(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "routed.#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	routed, _ := insertTxns(t, e.db, "routed.a", 2)
	testenv.WaitCount(t, e.consumer, 2, 30*time.Second)
	restarts := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")
	unrouted, last := insertTxns(t, e.db, "nowhere", 1)
	// Several failed attempts, counted: each return ends the session. The
	// slot check below proves nothing before the relay has tried.
	waitCounter(t, r.reg, "cdcrelay_pipeline_restarts_total", restarts+2, 30*time.Second)
	waitReturnedUntilRouted(t, e, unrouted, last)
	report(t, routed, e.consumer.Deliveries()[:2])
}

// TestIntegrationDroppedColumnStopsWithoutConfirming: a row the relay cannot
// map stops it with an error and leaves the slot before it.
func TestIntegrationDroppedColumnStopsWithoutConfirming(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox DROP COLUMN routing_key`); err != nil {
		t.Fatal(err)
	}
	var last uint64
	err := e.db.QueryRow(ctx, `
		WITH ins AS (INSERT INTO event_outbox (payload) VALUES ('{}') RETURNING id)
		SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn FROM ins`).Scan(&last)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Wait(t, 30*time.Second, "the relay to stop after an unmappable row")
	if !errors.Is(err, wal.ErrSchema) {
		t.Fatalf("relay ended with %v, want a schema error", err)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got > pglsn(last) {
		t.Fatalf("slot moved to %s past the unmappable row (%s)", got, pglsn(last))
	}
	if n := e.consumer.Count(); n != 0 {
		t.Fatalf("%d messages published", n)
	}
}

// TestIntegrationMessageShape checks the optional columns and the envelope.
func TestIntegrationMessageShape(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	other := testenv.UniqueName("cdcrelay.other")
	otherConsumer := testenv.MustConsumer(t, e.amqpURL, other, testenv.UniqueName("cdcrelay.oq"), "#")
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, other) })
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox ADD COLUMN headers jsonb, ADD COLUMN exchange text`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	r.waitStreaming(t)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := e.db.Exec(ctx, `INSERT INTO event_outbox (id, routing_key, payload, headers, exchange) VALUES
		('11111111-1111-1111-1111-111111111111', 'a', '{"event_type":"A","trace_context":"`+tp+`"}', '{"tenant":"t1","n":2}', NULL),
		('22222222-2222-2222-2222-222222222222', 'b', '{"x":1}', NULL, $1)`, other); err != nil {
		t.Fatal(err)
	}
	testenv.WaitCount(t, e.consumer, 1, 30*time.Second)
	testenv.WaitCount(t, otherConsumer, 1, 30*time.Second)
	d := e.consumer.Deliveries()[0]
	if d.MessageID != "11111111-1111-1111-1111-111111111111" || d.Type != "A" || d.Headers["traceparent"] != tp ||
		d.Headers["tenant"] != "t1" || d.Headers["n"] != int64(2) || d.Timestamp.IsZero() {
		t.Fatalf("first message %+v", d)
	}
	if idx := d.Headers[publish.HeaderTxIndex]; idx != int64(0) {
		t.Fatalf("index %v", idx)
	}
	o := otherConsumer.Deliveries()[0]
	if o.MessageID != "22222222-2222-2222-2222-222222222222" || o.Exchange != other || o.Headers[publish.HeaderTxIndex] != int64(1) {
		t.Fatalf("second message %+v", o)
	}
}
