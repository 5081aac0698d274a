package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// The tests of this file: a refusal during an
// adoption is pinned on its row, as on the stream, and the slot is created
// once. Before, the adoption that followed a refusal forgot the careful
// window its session had just opened, so a refusal never named its row;
// every retry dropped and created the slot again, and the rows before the
// refused one were published again each time (a reproduction: the row
// never parked, the 30 rows after it never published, the 30 before it
// delivered 499 times, the slot created 38 times in 60 s).

// refusedBacklog makes an outbox with an exchange column and, before any
// relay runs, n rows, one row naming an exchange that does not exist, then
// n rows: the backlog a first start adopts. It returns the rows before and
// after, and the refused row's id.
func refusedBacklog(t *testing.T, e *env, n int) (before, after []row, refused string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox ADD COLUMN exchange text`); err != nil {
		t.Fatal(err)
	}
	before, _ = insertTxns(t, e.db, "ok.before", ones(n)...)
	if err := e.db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload, exchange) VALUES ('ok.x', '{"n":1}', $1) RETURNING id::text`,
		missingExchange).Scan(&refused); err != nil {
		t.Fatal(err)
	}
	after, _ = insertTxns(t, e.db, "ok.after", ones(n)...)
	return before, after, refused
}

// missingExchange is the exchange the refused row names; no test declares
// it except TestIntegrationAdoptionRefusalStallNamed, which deletes it.
const missingExchange = "cdcrelay.test.adoption.missing"

// mostDeliveries is the largest number of times one of rows was delivered.
func mostDeliveries(rows []row, got []testenv.Delivery) int {
	want := make(map[string]bool, len(rows))
	for _, r := range rows {
		want[r.id] = true
	}
	counts := map[string]int{}
	most := 0
	for _, d := range got {
		if want[d.MessageID] {
			counts[d.MessageID]++
			most = max(most, counts[d.MessageID])
		}
	}
	return most
}

// pairsUnique fails the test if one (commit LSN, index) pair was given to
// two different events: a resumed adoption numbers its rows past the
// earlier attempts' (invariant 12).
func pairsUnique(t *testing.T, got []testenv.Delivery) {
	t.Helper()
	owner := map[relaytest.Position]string{}
	for _, d := range got {
		pos, err := relaytest.PositionOf(d)
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := owner[pos]; ok && id != d.MessageID {
			t.Fatalf("pair %v names two events, %s and %s", pos, id, d.MessageID)
		}
		owner[pos] = d.MessageID
	}
}

// slotCreations counts the slots the relay created.
func slotCreations(r *running) int {
	return strings.Count(r.logs.String(), "created replication slot")
}

// TestIntegrationAdoptionRefusalParked: with CDCRELAY_UNROUTABLE=park, a
// backlog row naming a missing exchange is parked during the adoption, as
// on the stream; the rows after it are published, the rows before it at
// most once more (the attempt the refusal ended), and the slot is created
// once.
func TestIntegrationAdoptionRefusalParked(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	before, after, refused := refusedBacklog(t, e, 30)
	r := e.startRelay(map[string]string{"UNROUTABLE": "park", "BACKOFF_MIN": "100ms", "BACKOFF_MAX": "2s"})
	waitAll(t, e.consumer, append(append([]row(nil), before...), after...), 60*time.Second)
	r.waitStreaming(t)
	checkParked(t, e, map[string]string{refused: `unroutable: the row's exchange "` + missingExchange + `" does not exist`})
	if n := slotCreations(r); n != 1 {
		t.Errorf("the slot was created %d times; a refusal during the adoption must not make a retry create it again", n)
	}
	pairsUnique(t, e.consumer.Deliveries())
	most := mostDeliveries(before, e.consumer.Deliveries())
	if most > 2 {
		t.Errorf("a row before the refused one was delivered %d times; at most twice (the attempt the refusal ended, and one more)", most)
	}
	t.Logf("refused backlog row parked; %d deliveries of %d rows, a row before it delivered at most %d times, %v pipeline restarts, slot created %d times",
		len(e.consumer.Deliveries()), len(before)+len(after), most, gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"), slotCreations(r))
}

// TestIntegrationAdoptionRefusalStallNamed: with the default
// CDCRELAY_UNROUTABLE=stall, the stall on a backlog row is named where an
// operator looks (cdcrelay_stalled_event_info, /readyz, the log) while
// the adoption retries, the rows before it are not published again on
// every retry, and the slot is created once. Declaring the exchange
// releases the row and the rest of the backlog.
func TestIntegrationAdoptionRefusalStallNamed(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	before, after, refused := refusedBacklog(t, e, 30)
	r := e.startRelay(map[string]string{"BACKOFF_MIN": "100ms", "BACKOFF_MAX": "2s"})
	waitAll(t, e.consumer, before, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for stalledLabels(t, r.reg)["id"] != refused {
		if time.Now().After(deadline) {
			t.Fatalf("cdcrelay_stalled_event_info %v after 60 s; want the backlog row %s, cause no_exchange", stalledLabels(t, r.reg), refused)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if labels := stalledLabels(t, r.reg); labels["cause"] != "no_exchange" || labels["exchange"] != missingExchange {
		t.Errorf("cdcrelay_stalled_event_info %v; want cause no_exchange, exchange %s", labels, missingExchange)
	}
	// A few more retries: the row stays named, nothing before it goes out
	// again, no slot is created again.
	restarts := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")
	deadline = time.Now().Add(30 * time.Second)
	for gauge(t, r.reg, "cdcrelay_pipeline_restarts_total") < restarts+3 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled adoption did not retry")
		}
		time.Sleep(50 * time.Millisecond)
	}
	status := r.relay.Status()
	if !strings.Contains(status, refused) {
		t.Errorf("/readyz says %q; it does not name the stalled row %s", status, refused)
	}
	if !strings.Contains(r.logs.String(), refused) {
		t.Errorf("the log does not name the stalled row %s", refused)
	}
	mostBefore := mostDeliveries(before, e.consumer.Deliveries())
	if mostBefore > 2 {
		t.Errorf("a row before the stalled one was delivered %d times while it stalled; at most twice", mostBefore)
	}
	if n := slotCreations(r); n != 1 {
		t.Errorf("the slot was created %d times while the adoption stalled, want once", n)
	}
	if got := len(e.consumer.Deliveries()); mostDeliveries(after, e.consumer.Deliveries()) != 0 {
		t.Errorf("rows after the stalled one were delivered (%d deliveries in all) before it", got)
	}

	// The exchange, bound to the relay's: the row goes, then the rest.
	ctx := context.Background()
	conn, err := testenv.DialAMQP(ctx, e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(ctx, e.amqpURL, missingExchange) })
	if err := ch.ExchangeDeclare(missingExchange, "fanout", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeBind(e.exchange, "", missingExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	waitAll(t, e.consumer, append(append(append([]row(nil), before...), row{id: refused}), after...), 60*time.Second)
	r.waitStreaming(t)
	var unmarked int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != 0 {
		t.Errorf("%d rows unmarked after the adoption ended", unmarked)
	}
	pairsUnique(t, e.consumer.Deliveries())
	t.Logf("stall on a backlog row named; a row before it delivered at most %d times over %v restarts; slot created %d times",
		mostBefore, gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"), slotCreations(r))
}
