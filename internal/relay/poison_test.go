package relay_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// poisonTable makes the outbox accept what services sometimes write by
// mistake: a text payload column and a nullable routing key.
func poisonTable(t *testing.T, e *env) {
	t.Helper()
	_, err := e.db.Exec(context.Background(), `ALTER TABLE event_outbox ALTER COLUMN routing_key DROP NOT NULL, ALTER COLUMN payload TYPE text`)
	if err != nil {
		t.Fatal(err)
	}
}

// insertPoison inserts, in one transaction, a good row, each kind of poison
// row, and a good row, and returns the ids of the good and the bad.
func insertPoison(t *testing.T, e *env) (good []row, bad map[string]string) {
	t.Helper()
	ctx := context.Background()
	bad = map[string]string{}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	add := func(key *string, payload, want string) {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ($1, $2) RETURNING id::text`, key, payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if want == "" {
			good = append(good, row{id: id, key: *key, payload: payload})
		} else {
			bad[id] = want
		}
	}
	k := "p.good"
	long := strings.Repeat("r", 300)
	add(&k, `{"event_type":"TestEvent","n":1}`, "")
	add(nil, `{"n":2}`, `column "routing_key" is NULL`)
	add(&k, `not json`, "not valid JSON")
	add(&long, `{"n":3}`, "routing key is 300 bytes")
	add(&k, `{"big":"`+strings.Repeat("x", 5000)+`"}`, "above CDCRELAY_MAX_MESSAGE_BYTES")
	add(&k, `{"event_type":"TestEvent","n":4}`, "")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return good, bad
}

// TestIntegrationPoisonParked: poison rows are parked (attempts+1,
// last_error, still unpublished), dead-lettered, and never stall the rows
// around them.
func TestIntegrationPoisonParked(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "p.#")
	poisonTable(t, e)
	dlx := testenv.UniqueName("cdcrelay.dlx")
	dead := testenv.MustConsumer(t, e.amqpURL, dlx, testenv.UniqueName("cdcrelay.dlq"), "#")
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, dlx) })
	r := e.startRelay(map[string]string{"MAX_MESSAGE_BYTES": "4KiB", "DEAD_LETTER_EXCHANGE": dlx})
	r.waitStreaming(t)

	good, bad := insertPoison(t, e)
	after, last := insertTxns(t, e.db, "p.after", 3)
	waitAll(t, e.consumer, append(append([]row(nil), good...), after...), 30*time.Second)
	testenv.WaitCount(t, dead, len(bad), 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)

	for _, d := range dead.Deliveries() {
		want, ok := bad[d.MessageID]
		if !ok {
			t.Fatalf("dead-lettered %s, not a poison row", d.MessageID)
		}
		if reason, _ := d.Headers[publish.HeaderError].(string); !strings.Contains(reason, want) {
			t.Fatalf("dead letter %s reason %q, want %q", d.MessageID, reason, want)
		}
		// The row's own routing key, an oversize row's too; none when it is
		// NULL or longer than a routing key can be.
		var key string
		if err := e.db.QueryRow(context.Background(), `SELECT coalesce(routing_key, '') FROM event_outbox WHERE id::text = $1`, d.MessageID).Scan(&key); err != nil {
			t.Fatal(err)
		}
		if len(key) > 255 {
			key = ""
		}
		if d.RoutingKey != key {
			t.Errorf("dead letter %s (%s) has routing key %q, want the row's %q", d.MessageID, want, d.RoutingKey, key)
		}
	}
	checkParked(t, e, bad)
	waitMarked(t, e, good, 10*time.Second)
	if n := gauge(t, r.reg, "cdcrelay_poison_events_total"); n != float64(len(bad)) {
		t.Fatalf("poison counter %v, want %d", n, len(bad))
	}
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts: poison must not look like a transport failure", n)
	}
}

// TestIntegrationPoisonStop: with CDCRELAY_POISON=stop the relay exits with
// an error naming the event and the slot stays before it.
func TestIntegrationPoisonStop(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	poisonTable(t, e)
	r := e.startRelay(map[string]string{"POISON": "stop"})
	r.waitStreaming(t)
	var last uint64
	err := e.db.QueryRow(context.Background(), `
		WITH a AS (INSERT INTO event_outbox (routing_key, payload) VALUES ('k', 'not json') RETURNING id)
		SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn FROM a`).Scan(&last)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Wait(t, 30*time.Second, "the relay to stop after a poison row with POISON=stop")
	if !errors.Is(err, publish.ErrPoison) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("relay ended with %v, want a poison error", err)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got > pglsn(last) {
		t.Fatalf("slot moved to %s past the poison row (%s)", got, pglsn(last))
	}
}

// TestIntegrationUnroutableToAlternateExchange: with an alternate exchange
// on the relay's exchange, unroutable messages go there instead of coming
// back as returns, and the relay goes on.
func TestIntegrationUnroutableToAlternateExchange(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	e := newEnv(t, testenv.PostgresOptions{}, "routed.#")
	ae := testenv.UniqueName("cdcrelay.ae")
	aeConsumer := testenv.MustConsumer(t, amqpURL, ae, testenv.UniqueName("cdcrelay.aeq"), "#")
	main := testenv.UniqueName("cdcrelay.main")
	_, ch := testenv.MustChannel(t, amqpURL)
	if err := ch.ExchangeDeclare(main, "topic", false, true, false, false, amqp.Table{"alternate-exchange": ae}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = testenv.DeleteExchange(context.Background(), amqpURL, main)
		_ = testenv.DeleteExchange(context.Background(), amqpURL, ae)
	})
	r := e.startRelay(map[string]string{"EXCHANGE": main})
	r.waitStreaming(t)
	rows, last := insertTxns(t, e.db, "nowhere", 20)
	waitAll(t, aeConsumer, rows, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	if n := gauge(t, r.reg, "cdcrelay_returns_total"); n != 0 {
		t.Fatalf("%v returns with an alternate exchange", n)
	}
}

// checkParked waits until every poison row has attempts 1 and its reason
// in last_error, and checks none is marked published.
func checkParked(t *testing.T, e *env, bad map[string]string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for id, want := range bad {
		for {
			var attempts int
			var lastError *string
			var published bool
			err := e.db.QueryRow(context.Background(), `SELECT attempts, last_error, published_at IS NOT NULL FROM event_outbox WHERE id = $1`, id).Scan(&attempts, &lastError, &published)
			if err != nil {
				t.Fatal(err)
			}
			if published {
				t.Fatalf("poison row %s marked published", id)
			}
			if attempts == 1 && lastError != nil && strings.Contains(*lastError, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("poison row %s: attempts %d, last_error %v; want 1 and %q", id, attempts, lastError, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestIntegrationPoisonInBacklog: poison rows already in the table when the
// relay adopts it are parked the same way, and the backlog goes on.
func TestIntegrationPoisonInBacklog(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "p.#")
	poisonTable(t, e)
	good, bad := insertPoison(t, e)
	e.startRelay(map[string]string{"MAX_MESSAGE_BYTES": "4KiB"})
	waitAll(t, e.consumer, good, 30*time.Second)
	checkParked(t, e, bad)
	waitMarked(t, e, good, 10*time.Second)
}

// TestIntegrationPoisonParkWaitsForCopy: a poison row with a dead-letter
// exchange is parked only once the broker has its copy. With the relay's
// bytes to the broker held, the copy is written but unconfirmed: the row
// stays unparked and the slot before it. The connection is then cut,
// the held copy with it; the next session handles the row again, so the
// copy arrives and the row ends parked. (Parked as soon as the copy was
// written, the row was recorded and the slot passed it, and the copy was
// lost with the connection.)
func TestIntegrationPoisonParkWaitsForCopy(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	u, err := url.Parse(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.MustProxy(t, u.Host)
	dlx := testenv.UniqueName("cdcrelay.dlx")
	dead := testenv.MustConsumer(t, e.amqpURL, dlx, testenv.UniqueName("cdcrelay.dlq"), "#")
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, dlx) })
	proxied := *u
	proxied.Host = proxy.Addr()
	r := e.startRelay(map[string]string{"AMQP_URL": proxied.String(), "DEAD_LETTER_EXCHANGE": dlx, "MARK_INTERVAL": "100ms"})
	r.waitStreaming(t)
	first, _ := insertTxns(t, e.db, "ok.first", 1)
	waitAll(t, e.consumer, first, 30*time.Second)

	proxy.HoldUpstream(true)
	bad, commit := insertTxns(t, e.db, strings.Repeat("r", 300), 1)
	r.WaitFor(t, 30*time.Second, "the poison row to be handled", func() bool {
		return gauge(t, r.reg, "cdcrelay_poison_events_total") == 1
	})
	time.Sleep(2 * time.Second) // twenty mark intervals, several status updates
	var attempts int
	if err := e.db.QueryRow(context.Background(), `SELECT attempts FROM event_outbox WHERE id = $1`, bad[0].id).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("the poison row was parked (attempts %d) while its dead-letter copy was unconfirmed", attempts)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got >= commit {
		t.Fatalf("slot confirmed %s, past the poison row (%s) whose copy was unconfirmed", got, commit)
	}

	proxy.Reset() // the held copy goes with the connection
	proxy.HoldUpstream(false)
	after, last := insertTxns(t, e.db, "ok.after", 1)
	waitAll(t, e.consumer, after, 60*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last, 30*time.Second)
	checkParked(t, e, map[string]string{bad[0].id: "routing key is 300 bytes"})
	testenv.WaitCount(t, dead, 1, 30*time.Second)
	if got := dead.Deliveries()[0].MessageID; got != bad[0].id {
		t.Fatalf("dead letter %q, want the poison row %s", got, bad[0].id)
	}
}
