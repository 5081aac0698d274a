package relay_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// This file: the relay's confirmed publishes land in the queue types
// RabbitMQ 4.x users bind to its exchange besides classic queues: streams,
// and quorum queues with a length limit. Every other test reads a classic
// queue through testenv.Consumer.

// TestIntegrationStreamTarget: a stream queue bound to the relay's exchange
// holds every event exactly once, in commit order, with its row's
// message_id and body, and the slot passed the last transaction, so each
// was confirmed. A stream is a log that reading does not consume: it keeps
// every copy the broker appended, so a duplicate publish shows here as a
// second copy of its message_id.
func TestIntegrationStreamTarget(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	stream := testenv.UniqueName("cdcrelay_stream")
	testenv.MustStream(t, e.amqpURL, e.exchange, stream, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	// Sizes from one row to more than the stream consumer's credit, so
	// that the read spans several credit rounds.
	sizes := []int{1, 7, 1, 25, 3, 160}
	rows, _ := insertTxns(t, e.db, "k", sizes...)
	waitAll(t, e.consumer, rows, 30*time.Second)
	commit := relaytest.CommitLSN(t, e.consumer, rows[len(rows)-1].id)
	// The slot moves past a transaction only once the broker acked all of
	// its events, and confirming the stream's queue is part of that ack.
	testenv.WaitConfirmed(t, e.db, slotName, commit+1, 30*time.Second)
	// Stopped before reading: the read ends on a quiet stream, and a
	// relay still running could append a late duplicate after it.
	if err := r.stop(t); err != nil {
		t.Fatalf("relay: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := testenv.ReadStream(ctx, e.amqpURL, stream, len(rows), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// report checks identity, body, properties and commit order, and that
	// none is missing; a stream holds copies, so duplicates must be 0.
	if dups := report(t, rows, got); dups != 0 || len(got) != len(rows) {
		t.Fatalf("the stream holds %d messages, %d of them duplicates; want the %d events once each", len(got), dups, len(rows))
	}
	t.Logf("%d events in %d transactions, each once in the stream, in commit order; slot at %s, past the last commit %s",
		len(rows), len(sizes), testenv.ConfirmedFlush(t, e.db, slotName), commit)
}

// overshootEvents is the one transaction's size in
// TestIntegrationQuorumLengthLimitOvershoot.
const overshootEvents = 50

// TestIntegrationQuorumLengthLimitOvershoot documents the broker fact
// docs/messages.md ("Bounded queues") relies on: a quorum queue with
// x-max-length 2 and x-overflow reject-publish, with no consumer, takes
// more than 2 messages from a publisher that pipelines them. A quorum
// queue checks its limit against what its log has applied, not against
// what is in flight through it, so of the 50 events of one transaction
// published back to back (the relay keeps up to CDCRELAY_MAX_IN_FLIGHT
// unconfirmed) it accepts every one that arrives before it has applied
// the first ones, and nacks the rest. How many that is depends on timing,
// measured with the relay under -race: on RabbitMQ 3.10.8 18 to 50 of the
// 50 (all 50 in 14 of 21 runs), on 4.3.6 7 to 50 (all 50 in 5 of 9),
// always the transaction's first ones. With fewer than 50 the relay
// retries the first refused event, alone, for as long as nothing frees
// room.
//
// Whatever the broker decides, no event may be lost: each is in the queue
// or the relay still holds it (the slot did not pass its transaction).
// That part must hold on every broker. The overshoot is asserted too (the
// queue held more than 2): if a future broker enforces the bound against
// in-flight messages, this test fails there, and docs/messages.md must
// change to say that quorum queues refuse at the limit.
func TestIntegrationQuorumLengthLimitOvershoot(t *testing.T) {
	// The env's classic queue takes what the relay publishes too: its
	// deliveries give the transaction's commit LSN and say how many
	// events were published at least once.
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	queue := testenv.UniqueName("cdcrelay_bounded")
	mustBoundedQuorum(t, e, queue, 2)
	r := e.startRelay(map[string]string{"MAX_IN_FLIGHT": "1000"})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "k", overshootEvents)
	testenv.WaitCount(t, e.consumer, 1, 30*time.Second)
	first, err := relaytest.PositionOf(e.consumer.Deliveries()[0])
	if err != nil {
		t.Fatal(err)
	}
	commit := first.LSN
	passed := settle(t, e, r, commit, 30*time.Second)
	nacks := gauge(t, r.reg, "cdcrelay_nacks_total")
	// Stopped before the queue is read: nothing more is published, and
	// the slot's position read next is final.
	if err := r.stop(t); err != nil {
		t.Fatalf("relay: %v", err)
	}
	confirmed := testenv.ConfirmedFlush(t, e.db, slotName)
	_, ch := testenv.MustChannel(t, e.amqpURL)
	st, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	held := heldEvents(t, ch, queue, rows)
	published := map[string]bool{}
	for _, d := range e.consumer.Deliveries() {
		published[d.MessageID] = true
	}
	t.Logf("quorum queue x-max-length 2, reject-publish, no consumer; one transaction of %d events: %d published at least once, "+
		"the queue holds %d messages (%d distinct events, positions %s); %v nacks; slot at %s, commit %s, every event acked: %v",
		overshootEvents, len(published), st.Messages, len(held), positions(rows, held), nacks, confirmed, commit, passed)
	var lost []string
	for _, rw := range rows {
		if !held[rw.id] {
			lost = append(lost, rw.id)
		}
	}
	// Lost: the slot passed the transaction (confirmed > its commit LSN,
	// relaytest.CommitLSN) while some of its events are not in the queue;
	// the relay would never publish them again.
	if confirmed > commit && len(lost) > 0 {
		t.Errorf("the slot passed the transaction (%s > %s) but %d of its %d events are not in the queue, e.g. %v",
			confirmed, commit, len(lost), overshootEvents, lost[:min(5, len(lost))])
	}
	// The broker fact docs/messages.md describes: the limit of 2 is
	// overshot. If this fails, the broker now enforces the limit against
	// pipelined publishes: change the docs, not this assertion.
	if st.Messages <= 2 {
		t.Errorf("the queue holds %d messages, within its x-max-length of 2: this broker enforces the bound against a pipelined publisher, and docs/messages.md (Bounded queues) must say so", st.Messages)
	}
}

// mustBoundedQuorum declares a quorum queue with x-max-length limit and
// reject-publish overflow, bound to the env's exchange for every routing
// key and with no consumer, and deletes it when the test ends.
func mustBoundedQuorum(t *testing.T, e *env, queue string, limit int) {
	t.Helper()
	_, ch := testenv.MustChannel(t, e.amqpURL)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := testenv.DeleteQueue(ctx, e.amqpURL, queue); err != nil {
			t.Logf("delete %s: %v", queue, err)
		}
	})
	args := amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(limit), "x-overflow": "reject-publish"}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", queue, err)
	}
	if err := ch.QueueBind(queue, "#", e.exchange, false, nil); err != nil {
		t.Fatalf("bind %s: %v", queue, err)
	}
}

// settle waits until the relay is done with the transaction committed at
// commit, one way or the other, and reports which: true when the slot
// passed it (the broker acked every event), false once the broker has
// refused 3 publishes. A refusal is no failure here: with no consumer to
// free room, the relay retries the refused event, first and alone, for as
// long as the test lets it, and the queue holds what it took before. It
// fails t when neither happens within the time given.
func settle(t *testing.T, e *env, r *running, commit pglogrepl.LSN, within time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if testenv.ConfirmedFlush(t, e.db, slotName) > commit {
			return true
		}
		if gauge(t, r.reg, "cdcrelay_nacks_total") >= 3 {
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the slot has not passed the transaction (commit %s) and the broker refused nothing", within, commit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// positions lists the indexes in rows of the events held, as ranges
// ("0-34"): a queue that refuses at a limit holds a prefix of what reached
// it, one that overshoots by chance of timing may not.
func positions(rows []row, held map[string]bool) string {
	var out []string
	start := -1
	for i := 0; i <= len(rows); i++ {
		in := i < len(rows) && held[rows[i].id]
		switch {
		case in && start < 0:
			start = i
		case !in && start >= 0:
			if start == i-1 {
				out = append(out, strconv.Itoa(start))
			} else {
				out = append(out, fmt.Sprintf("%d-%d", start, i-1))
			}
			start = -1
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

// heldEvents gets every message in queue without acking it (they stay
// in the queue until it is deleted) and returns the events among them by
// id; a message that is not one of rows, or has another body, fails t.
func heldEvents(t *testing.T, ch *amqp.Channel, queue string, rows []row) map[string]bool {
	t.Helper()
	want := make(map[string]row, len(rows))
	for _, rw := range rows {
		want[rw.id] = rw
	}
	held := map[string]bool{}
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return held
		}
		rw, known := want[d.MessageId]
		if !known || string(d.Body) != rw.payload {
			t.Fatalf("%s holds message_id %q body %s; not one of the transaction's events", queue, d.MessageId, d.Body)
		}
		held[d.MessageId] = true
	}
}
