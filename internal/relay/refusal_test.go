package relay_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// This file: a broker that says no to some messages (docs/messages.md,
// "When the broker refuses a message"; invariants 3 and 11, docs/architecture.md).

// slowQueue is a queue bound to the relay's exchange with a length limit
// that refuses publishes when full (x-overflow=reject-publish), drained by a
// consumer slower than the outbox: every delivery is recorded, then acked
// after a pause.
type slowQueue struct {
	mu   sync.Mutex
	ids  []string
	conn *amqp.Connection
}

func startSlowQueue(t *testing.T, e *env, binding string, maxLen int, perMessage time.Duration) *slowQueue {
	t.Helper()
	ctx := context.Background()
	conn, err := testenv.DialAMQP(ctx, e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	q := &slowQueue{conn: conn}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.UniqueName("cdcrelay.bounded")
	// Exclusive to conn, which declares, binds and consumes it and lives as
	// long as the test (the relay only publishes to it through the
	// exchange): RabbitMQ 4.3 refuses a transient queue that is not
	// exclusive, and this one goes away with conn, so nothing deletes it.
	args := amqp.Table{"x-max-length": int64(maxLen), "x-overflow": "reject-publish"}
	if _, err := ch.QueueDeclare(name, false, false, true, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, binding, e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			q.mu.Lock()
			q.ids = append(q.ids, d.MessageId)
			q.mu.Unlock()
			time.Sleep(perMessage)
			_ = d.Ack(false)
		}
	}()
	return q
}

// counts returns how many deliveries and distinct events the queue got.
func (q *slowQueue) counts() (deliveries, distinct int, most int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	seen := map[string]int{}
	for _, id := range q.ids {
		seen[id]++
		most = max(most, seen[id])
	}
	return len(q.ids), len(seen), most
}

func (q *slowQueue) has(ids []string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	seen := make(map[string]bool, len(q.ids))
	for _, id := range q.ids {
		seen[id] = true
	}
	for _, id := range ids {
		if !seen[id] {
			return false
		}
	}
	return true
}

// boundedQueue is one run of a queue with x-max-length and reject-publish
// in front of a consumer slower than the outbox.
type boundedQueue struct {
	maxLen     int
	perMessage time.Duration // the consumer's pause before each ack
	singles    int           // one-row transactions first
	big        int           // then one transaction of this many rows (0: none)
	after      int           // then more one-row transactions
	vars       map[string]string
	within     time.Duration
}

// run checks that every event gets through, that acknowledged events are
// not published again session after session, and that the slot follows;
// it returns the duplicates.
func (b boundedQueue) run(t *testing.T) int {
	e := newEnv(t, testenv.PostgresOptions{}, "unused.#")
	q := startSlowQueue(t, e, "bq.#", b.maxLen, b.perMessage)
	r := e.startRelay(b.vars)
	r.waitStreaming(t)

	var all []row
	var last pglogrepl.LSN
	add := func(key string, sizes ...int) {
		if len(sizes) == 0 {
			return
		}
		rows, l := insertTxns(t, e.db, key, sizes...)
		all, last = append(all, rows...), l
	}
	add("bq.one", ones(b.singles)...)
	if b.big > 0 {
		add("bq.big", b.big)
	}
	add("bq.after", ones(b.after)...)
	ids := make([]string, len(all))
	for i, x := range all {
		ids[i] = x.id
	}
	began := time.Now()
	for !q.has(ids) {
		if time.Since(began) > b.within {
			n, distinct, _ := q.counts()
			t.Fatalf("after %s the queue got %d deliveries of %d distinct events, %d committed; restarts %v",
				b.within, n, distinct, len(all), gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(began)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	waitMarked(t, e, all, 10*time.Second)
	n, distinct, most := q.counts()
	restarts := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")
	nacks := gauge(t, r.reg, "cdcrelay_nacks_total")
	resumed := gauge(t, r.reg, "cdcrelay_resumed_events_total")
	dups := n - distinct
	t.Logf("%d events through in %s: %d deliveries, %d duplicates (%.3f per accepted event), at most %d deliveries of one event; %v nacks, %v restarts, %v events skipped as done",
		len(all), took.Round(100*time.Millisecond), n, dups, float64(dups)/float64(distinct), most, nacks, restarts, resumed)
	if nacks == 0 || restarts == 0 {
		t.Fatalf("the queue never refused anything (%v nacks, %v restarts): the run did not test the bound", nacks, restarts)
	}
	// A refused message ends a session; the next one publishes one message
	// at a time, so nothing is taken behind a refused message, and only a
	// burst at full window (at most one per 10 s without a refusal) can
	// bring duplicates, each event at most once.
	window := 1000
	if v, ok := b.vars["MAX_IN_FLIGHT"]; ok {
		window, _ = strconv.Atoi(v)
	}
	if most > 2 || dups > window*(1+int(took/(10*time.Second))) {
		t.Fatalf("%d duplicates, one event delivered %d times: acknowledged events were published again", dups, most)
	}
	return dups
}

// TestIntegrationBoundedQueueMakesProgress is the review's livelock, at a
// scale for make test: one-row transactions and a transaction larger than
// the queue's room. On the old relay the slot froze and the same events
// went round and round (TestIntegrationBoundedQueueReviewSetup runs the
// review's own set-up).
func TestIntegrationBoundedQueueMakesProgress(t *testing.T) {
	boundedQueue{
		maxLen: 40, perMessage: 5 * time.Millisecond, // a consumer at up to 200 msg/s
		singles: 300, big: 150, after: 100,
		vars: map[string]string{"MAX_IN_FLIGHT": "200"}, within: 90 * time.Second,
	}.run(t)
}

func ones(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// TestIntegrationUnroutableStallNamesTheRow: with the default
// CDCRELAY_UNROUTABLE=stall, a row whose routing key no queue is bound for
// stalls the stream; the events committed before it are not published
// again on every retry, and the log, /readyz and a metric name the row's
// id, routing key and exchange. Binding a queue releases it.
func TestIntegrationUnroutableStallNamesTheRow(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	before, _ := insertTxns(t, e.db, "ok.before", ones(20)...)
	unrouted, last := insertTxns(t, e.db, "nowhere", 1)
	waitAll(t, e.consumer, before, 30*time.Second)
	// Several retries of the stalled row.
	deadline := time.Now().Add(30 * time.Second)
	for gauge(t, r.reg, "cdcrelay_pipeline_restarts_total") < 4 {
		if time.Now().After(deadline) {
			t.Fatal("the unroutable row did not make the relay retry")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dups := len(e.consumer.Deliveries()) - len(before); dups != 0 {
		t.Fatalf("%d events committed before the unroutable one were published again while it stalled", dups)
	}
	id := unrouted[0].id
	labels := stalledLabels(t, r.reg)
	if labels["id"] != id || labels["routing_key"] != "nowhere" || labels["exchange"] != e.exchange || labels["cause"] != "no_route" {
		t.Fatalf("cdcrelay_stalled_event_info %v, want id %s, routing key nowhere, exchange %s, cause no_route", labels, id, e.exchange)
	}
	status := r.relay.Status()
	for _, want := range []string{id, `"nowhere"`, e.exchange} {
		if !strings.Contains(status, want) {
			t.Fatalf("/readyz says %q; it does not name %s", status, want)
		}
	}
	if !strings.Contains(r.logs.String(), id) {
		t.Fatalf("the log does not name the stalled row %s", id)
	}
	waitReturnedUntilRouted(t, e, unrouted, last)
	deadline = time.Now().Add(10 * time.Second)
	for len(stalledLabels(t, r.reg)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("cdcrelay_stalled_event_info still %v after the row was routed", stalledLabels(t, r.reg))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stalledLabels returns the labels of the cdcrelay_stalled_event_info
// series, empty when there is none.
func stalledLabels(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, f := range families {
		if f.GetName() != "cdcrelay_stalled_event_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
		}
	}
	return labels
}

// parkingUnroutable starts a relay with CDCRELAY_UNROUTABLE=park and a
// dead-letter exchange, over an outbox with an exchange column, and a
// consumer of that exchange's copies.
func parkingUnroutable(t *testing.T) (*env, *running, *testenv.Consumer) {
	t.Helper()
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE event_outbox ADD COLUMN exchange text`); err != nil {
		t.Fatal(err)
	}
	dlx := testenv.UniqueName("cdcrelay.dlx")
	dead := testenv.MustConsumer(t, e.amqpURL, dlx, testenv.UniqueName("cdcrelay.dlq"), "#")
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, dlx) })
	r := e.startRelay(map[string]string{"UNROUTABLE": "park", "DEAD_LETTER_EXCHANGE": dlx})
	r.waitStreaming(t)
	return e, r, dead
}

// TestIntegrationUnroutablePark: with CDCRELAY_UNROUTABLE=park a returned
// row and a row naming an exchange that does not exist are parked as
// poison (last_error says why, the dead-letter exchange gets a copy), and
// the rows after them are delivered.
func TestIntegrationUnroutablePark(t *testing.T) {
	e, r, dead := parkingUnroutable(t)
	ctx := context.Background()

	before, _ := insertTxns(t, e.db, "ok.before", ones(5)...)
	unrouted, _ := insertTxns(t, e.db, "nowhere", 1)
	var missingExchange string
	if err := e.db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload, exchange) VALUES ('ok.x', '{"n":1}', 'no.such.exchange') RETURNING id::text`).Scan(&missingExchange); err != nil {
		t.Fatal(err)
	}
	after, last := insertTxns(t, e.db, "ok.after", ones(5)...)
	waitAll(t, e.consumer, append(append([]row(nil), before...), after...), 60*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	checkParked(t, e, map[string]string{
		unrouted[0].id:  `unroutable: the broker returned it from exchange "` + e.exchange + `" with routing key "nowhere"`,
		missingExchange: `unroutable: the row's exchange "no.such.exchange" does not exist`,
	})
	testenv.WaitCount(t, dead, 2, 30*time.Second)
	if n := len(stalledLabels(t, r.reg)); n != 0 {
		t.Fatalf("a parked row left cdcrelay_stalled_event_info set")
	}
}

// TestIntegrationBrokerRefusedHeaderParked: a row whose headers the broker
// refuses (CC must be an array of strings) is poison: parked with the
// reason, and the rows after it flow. On the old relay the broker closed
// the channel on every retry and the database stalled for good.
func TestIntegrationBrokerRefusedHeaderParked(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox ADD COLUMN headers jsonb`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	r.waitStreaming(t)
	bad := map[string]string{}
	for _, h := range []string{`{"CC": "x"}`, `{"BCC": [1, 2]}`} {
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload, headers) VALUES ('k', '{"n":1}', $1) RETURNING id::text`, h).Scan(&id); err != nil {
			t.Fatal(err)
		}
		bad[id] = "RabbitMQ accepts only"
	}
	after, last := insertTxns(t, e.db, "k.after", 1, 2)
	waitAll(t, e.consumer, after, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	checkParked(t, e, bad)
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts for headers the relay can judge before sending", n)
	}
}

// TestIntegrationDeadLetterCopyNeverStalls: a dead-letter exchange with no
// binding returns every copy. The poison row is parked all the same, the
// copy's fate is counted, and nothing restarts. On the old relay each
// session ended on the copy's return and the row was never parked.
func TestIntegrationDeadLetterCopyNeverStalls(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	poisonTable(t, e)
	dlx := testenv.UniqueName("cdcrelay.dlx.unbound")
	if err := testenv.DeclareExchange(context.Background(), e.amqpURL, dlx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, dlx) })
	r := e.startRelay(map[string]string{"DEAD_LETTER_EXCHANGE": dlx})
	r.waitStreaming(t)
	var bad string
	if err := e.db.QueryRow(context.Background(), `INSERT INTO event_outbox (routing_key, payload) VALUES ('k', 'not json') RETURNING id::text`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	after, last := insertTxns(t, e.db, "k.after", 1, 3)
	waitAll(t, e.consumer, after, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	checkParked(t, e, map[string]string{bad: "not valid JSON"})
	if n := counter(t, r.reg, "cdcrelay_dead_letter_failures_total", "outcome", "returned"); n != 1 {
		t.Fatalf("cdcrelay_dead_letter_failures_total{outcome=returned} = %v, want 1", n)
	}
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts for a dead-letter copy nobody routes", n)
	}
}

// TestIntegrationUnroutableParkCopyNotLost: a returned row and, right
// behind it in the same transaction, a row naming an exchange that does not
// exist. The second publish closes the channel before the first row's
// dead-letter copy, sent when its return arrives, is confirmed: that copy
// is lost with the channel. The first row is parked only once its copy's
// fate is known, so the next session handles it again and sends the copy
// again: both rows end parked and both copies arrive.
func TestIntegrationUnroutableParkCopyNotLost(t *testing.T) {
	e, _, dead := parkingUnroutable(t)
	ctx := context.Background()
	var unrouted, missingExchange string
	err := pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('nowhere', '{"n":1}') RETURNING id::text`).Scan(&unrouted); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload, exchange) VALUES ('ok.x', '{"n":2}', 'no.such.exchange') RETURNING id::text`).Scan(&missingExchange)
	})
	if err != nil {
		t.Fatal(err)
	}
	after, last := insertTxns(t, e.db, "ok.after", 1, 1)
	waitAll(t, e.consumer, after, 60*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	checkParked(t, e, map[string]string{
		unrouted:        `unroutable: the broker returned it from exchange "` + e.exchange + `" with routing key "nowhere"`,
		missingExchange: `unroutable: the row's exchange "no.such.exchange" does not exist`,
	})
	testenv.WaitCount(t, dead, 2, 30*time.Second)
}
