package faults_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationBrokerLinkReset cuts the relay's broker connection with an RST in
// the middle of a steady load: the relay notices at once, reconnects and
// publishes again from the slot, so everything unconfirmed goes out again
// in order.
func TestIntegrationBrokerLinkReset(t *testing.T) {
	w := newWorld(t, worldOptions{AMQPProxy: true})
	r := w.startRelay(map[string]string{"AMQP_HEARTBEAT": "2s"})
	r.waitStreaming(t)

	l := w.load(3000, 1500, 10)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	w.amqpProxy.Reset()
	l.wait(t, time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	if n := r.restarts(t); n < 1 {
		t.Fatalf("%d pipeline restarts after a reset", n)
	}
	r.transportFailuresOnly(t)
	w.check(t, "broker link reset (RST) under load", fault, l.since(fault), "")
}

// TestIntegrationBrokerNacks: a queue with x-overflow=reject-publish and
// x-max-length=10 makes the broker nack the 11th event routed to it. The
// slot must not move past it, the relay must say what is wrong and retry
// with backoff, and once a consumer drains the queue everything goes
// through.
func TestIntegrationBrokerNacks(t *testing.T) {
	w := newWorld(t, worldOptions{})
	limited := testenv.UniqueName("cdcrelay.faults.limited")
	// Durable, not exclusive: w.drain consumes it from another connection,
	// and RabbitMQ 4.3 refuses a transient queue that is not exclusive.
	// Nothing auto-deletes it, so the cleanup, registered before the
	// declaration so that a failed bind still removes it, deletes it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteQueue(ctx, w.amqpURL, limited)
	})
	w.amqp(t, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(limited, true, false, false, false, amqp.Table{
			"x-max-length": int32(10), "x-overflow": "reject-publish",
		}); err != nil {
			return err
		}
		return ch.QueueBind(limited, "limited.#", w.exchange, false, nil)
	})
	r := w.startRelay(nil)
	r.waitStreaming(t)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)

	// 20 single-event transactions for the limited queue: 10 fit.
	var over []commit
	for range 20 {
		id, err := insertTx(context.Background(), w.db, "limited.x", 1)
		if err != nil {
			t.Fatal(err)
		}
		over = append(over, commit{at: time.Now(), ids: id})
	}
	rejected := over[10].ids[0]
	// The consumer's queue takes the first ten and the refused one (only
	// the limited queue refuses it). What follows waits in commit order
	// behind it: after the first nack the relay publishes one message at a
	// time, so the refused event goes first at every retry and nothing
	// behind it is published again and again.
	w.waitIDs(t, ids(over[:11]), 30*time.Second)
	boundary := w.commitLSN(t, rejected)
	failing := time.Now()
	for time.Since(failing) < 8*time.Second {
		if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
			t.Fatalf("slot at %s, past the nacked event's transaction (commit %s)", got, boundary)
		}
		time.Sleep(100 * time.Millisecond)
	}
	failures := r.failures()
	checkRetries(t, "nack", failures, func(f string) bool {
		// Every attempt fails on the 11th event: the ten before it are not
		// published again (publish.Carryover).
		_, rest, _ := strings.Cut(f, "event ")
		id, _, _ := strings.Cut(rest, " ")
		return strings.Contains(f, "nacked") && id == rejected && strings.Contains(f, "reject-publish")
	})
	if n := r.metric(t, "cdcrelay_nacks_total"); n < 1 {
		t.Fatalf("cdcrelay_nacks_total = %v", n)
	}

	// The fix: a consumer drains the full queue.
	fixed := time.Now()
	w.drain(t, limited)
	w.waitIDs(t, ids(over), 30*time.Second) // the refused event, then what waited behind it
	testenv.WaitConfirmed(t, w.db, slotName, w.commitLSN(t, over[len(over)-1].ids[0])+1, 30*time.Second)
	recovery := time.Since(fixed)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	r.running(t)
	w.checkRecovered(t, "broker nacks (x-overflow=reject-publish, x-max-length=10)", recovery,
		fmt.Sprintf("retried with backoff, retry_in %s; recovery = a consumer started draining the full queue until the slot passed the last event", retryIns(failures)))
}

// TestIntegrationBrokerReturns: an event whose routing key no queue is bound to comes
// back (mandatory). The slot must not move past it, the relay must say
// what is wrong and retry with backoff, and once a queue is bound it is
// delivered.
func TestIntegrationBrokerReturns(t *testing.T) {
	w := newWorld(t, worldOptions{Binding: "ev.#"})
	r := w.startRelay(nil)
	r.waitStreaming(t)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)

	// One transaction: a routable event, then one for a key with no binding.
	var marker, orphan string
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, w.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('ev.k0', '{"n": 1, "event_type": "TestEvent"}') RETURNING id::text`).Scan(&marker); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('orphan.x', '{"n": 2, "event_type": "TestEvent"}') RETURNING id::text`).Scan(&orphan)
	})
	if err != nil {
		t.Fatal(err)
	}
	w.waitIDs(t, []string{marker}, 30*time.Second)
	boundary := w.commitLSN(t, marker)
	failing := time.Now()
	for time.Since(failing) < 8*time.Second {
		if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
			t.Fatalf("slot at %s, past the returned event's transaction (commit %s)", got, boundary)
		}
		time.Sleep(100 * time.Millisecond)
	}
	failures := r.failures()
	checkRetries(t, "return", failures, func(f string) bool {
		return strings.Contains(f, "unroutable") && strings.Contains(f, orphan) && strings.Contains(f, "orphan.x")
	})
	if n := r.metric(t, "cdcrelay_returns_total"); n < 1 {
		t.Fatalf("cdcrelay_returns_total = %v", n)
	}

	fixed := time.Now()
	late := testenv.MustConsumer(t, w.amqpURL, w.exchange, testenv.UniqueName("cdcrelay.faults.late"), "orphan.#")
	testenv.WaitCount(t, late, 1, 30*time.Second)
	testenv.WaitConfirmed(t, w.db, slotName, boundary+1, 30*time.Second)
	recovery := time.Since(fixed)
	if d := late.Deliveries()[0]; d.MessageID != orphan {
		t.Fatalf("late consumer got %s, want %s", d.MessageID, orphan)
	}
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	r.running(t)
	// The orphan went to the late queue; the main consumer checks the rest.
	if _, err := w.db.Exec(ctx, `DELETE FROM event_outbox WHERE id = $1`, orphan); err != nil {
		t.Fatal(err)
	}
	w.checkRecovered(t, "broker returns (no binding for the routing key)", recovery,
		fmt.Sprintf("retried with backoff, retry_in %s; recovery = queue bound until the slot passed the event", retryIns(failures)))
}

// checkRetries checks that the relay kept retrying with backoff (the
// delays it logged grow from BACKOFF_MIN towards BACKOFF_MAX, 500ms to 5s
// here, each wait drawn from [delay/2, delay]: not a tight loop, and it
// does not give up) and said clearly what was wrong each time.
func checkRetries(t *testing.T, what string, failures []string, clear func(string) bool) {
	t.Helper()
	var delays []time.Duration
	for _, f := range failures {
		if i := strings.LastIndex(f, "retry_in="); i >= 0 {
			if d, err := time.ParseDuration(strings.Fields(f[i+len("retry_in="):])[0]); err == nil {
				delays = append(delays, d)
			}
		}
	}
	if len(delays) < 3 {
		t.Fatalf("%d retries logged after a %s; want the relay to keep retrying", len(delays), what)
	}
	if delays[0] > 600*time.Millisecond || delays[len(delays)-1] < 2*delays[0] {
		t.Errorf("retry delays %v after a %s: want backoff growing from 500ms", delays, what)
	}
	for _, d := range delays {
		if d > 6*time.Second {
			t.Errorf("retry delay %s above BACKOFF_MAX (5s) + jitter", d)
		}
	}
	for _, f := range failures {
		if !clear(f) {
			t.Errorf("unclear failure for a %s: %s", what, f)
		}
	}
}

// retryIns lists the retry delays the relay logged.
func retryIns(failures []string) string {
	var out []string
	for _, f := range failures {
		if i := strings.LastIndex(f, "retry_in="); i >= 0 {
			out = append(out, f[i+len("retry_in="):])
		}
	}
	return strings.Join(out, ", ")
}
