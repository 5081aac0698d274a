package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// oversizeTable gives the outbox what services' tables often have: a text
// id, a headers column and a type column.
func oversizeTable(t *testing.T, e *env) {
	t.Helper()
	_, err := e.db.Exec(context.Background(), `
		ALTER TABLE event_outbox ALTER COLUMN id TYPE text;
		ALTER TABLE event_outbox ADD COLUMN headers jsonb, ADD COLUMN event_type text`)
	if err != nil {
		t.Fatal(err)
	}
}

// oversizeCase is one row no AMQP client can encode as it stands.
type oversizeCase struct {
	name             string
	id               string // "" = generated
	eventType        *string
	payload, headers string
	value            string // the over-long value, never to be logged or stored whole
	reason           string // substring of last_error
}

func oversizeCases() []oversizeCase {
	long := func(c byte) string { return strings.Repeat(string(c), 300) }
	typ := long('t')
	return []oversizeCase{
		{name: "envelope event_type", payload: `{"event_type":"` + long('e') + `"}`, value: long('e'), reason: "type is 300 bytes"},
		{name: "type column", eventType: &typ, payload: `{"n":1}`, value: typ, reason: "type is 300 bytes"},
		{name: "text id", id: long('i'), payload: `{"event_type":"TestEvent"}`, value: long('i'), reason: "message_id is 300 bytes"},
		{name: "header key", payload: `{"event_type":"TestEvent"}`, headers: `{"` + long('k') + `":"v"}`, value: long('k'), reason: "header key"},
		{name: "nested header key", payload: `{"event_type":"TestEvent"}`, headers: `{"a":{"b":[{"` + long('n') + `":1}]}}`, value: long('n'), reason: `header key headers["a"]["b"][0]`},
		{name: "headers above the frame size", payload: `{"event_type":"TestEvent"}`, headers: `{"big":"` + strings.Repeat("h", 200_000) + `"}`, value: strings.Repeat("h", 300), reason: "above the broker's frame size"},
	}
}

// insertOversize inserts, in one transaction, a good row, every oversize
// case and a good row; it returns the good rows and the bad ones by id.
func insertOversize(t *testing.T, e *env) (good []row, bad map[string]oversizeCase) {
	t.Helper()
	ctx := context.Background()
	bad = map[string]oversizeCase{}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	addGood := func(n int) {
		payload := `{"event_type": "TestEvent", "n": ` + string(rune('0'+n)) + `}`
		var r row
		if err := tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('o.good', $1) RETURNING id, routing_key, payload::text`, payload).Scan(&r.id, &r.key, &r.payload); err != nil {
			t.Fatal(err)
		}
		good = append(good, r)
	}
	addGood(1)
	for _, c := range oversizeCases() {
		var headers *string
		if c.headers != "" {
			headers = &c.headers
		}
		var id string
		err := tx.QueryRow(ctx, `INSERT INTO event_outbox (id, routing_key, payload, headers, event_type)
			VALUES (COALESCE(NULLIF($1, ''), gen_random_uuid()::text), 'o.bad', $2, $3, $4) RETURNING id`,
			c.id, c.payload, headers, c.eventType).Scan(&id)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		bad[id] = c
	}
	addGood(2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return good, bad
}

// TestIntegrationOversizeShortStringsParked: rows that amqp091-go cannot
// encode (a type, message_id or header key over AMQP's 255-byte short
// string, at any depth, or headers above the broker's frame size) are
// parked, not retried: the rows after them arrive within seconds, the
// pipeline never restarts, last_error names the problem with the value
// clipped, and no log line carries a value at full length. Before, each
// such row failed inside the client library or made the broker close the
// connection, and the relay restarted from the slot forever.
func TestIntegrationOversizeShortStringsParked(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "o.#")
	oversizeTable(t, e)
	dlx := testenv.UniqueName("cdcrelay.dlx")
	dead := testenv.MustConsumer(t, e.amqpURL, dlx, testenv.UniqueName("cdcrelay.dlq"), "#")
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, dlx) })
	r := e.startRelay(map[string]string{"DEAD_LETTER_EXCHANGE": dlx})
	r.waitStreaming(t)

	began := time.Now()
	good, bad := insertOversize(t, e)
	after, last := insertTxns(t, e.db, "o.after", 3)
	waitAll(t, e.consumer, append(append([]row(nil), good...), after...), 30*time.Second)
	delivered := time.Since(began)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	testenv.WaitCount(t, dead, len(bad), 30*time.Second)
	t.Logf("%d good rows around %d oversize ones delivered in %s", len(good)+len(after), len(bad), delivered.Round(time.Millisecond))

	want := map[string]string{}
	for id, c := range bad {
		want[id] = c.reason
	}
	checkParked(t, e, want)
	for id, c := range bad {
		var lastError string
		if err := e.db.QueryRow(context.Background(), `SELECT last_error FROM event_outbox WHERE id = $1`, id).Scan(&lastError); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(lastError, c.value) || len(lastError) > 512 {
			t.Fatalf("%s: last_error holds the value at full length (%d bytes): %.200s", c.name, len(lastError), lastError)
		}
		if c.name != "headers above the frame size" && !strings.Contains(lastError, "…(300 bytes)") {
			t.Fatalf("%s: last_error %q does not show the clipped value", c.name, lastError)
		}
	}
	for _, d := range dead.Deliveries() {
		id := d.MessageID
		if id == "" { // too long for message_id: the dead letter carries it as a header
			id, _ = d.Headers[publish.HeaderID].(string)
		}
		if _, ok := bad[id]; !ok {
			t.Fatalf("dead-lettered %.80q, not an oversize row", id)
		}
	}
	oversizeWaitMarked(t, e, good, 10*time.Second)
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts: an unencodable row must be parked, not retried", n)
	}
	if n := gauge(t, r.reg, "cdcrelay_poison_events_total"); n != float64(len(bad)) {
		t.Fatalf("poison counter %v, want %d", n, len(bad))
	}
	logs := r.logs.String()
	for _, c := range bad {
		if strings.Contains(logs, c.value) {
			t.Fatalf("%s: the relay logged the value at full length", c.name)
		}
	}
}

// oversizeWaitMarked waits until every row is marked published (ids of a
// text id column).
func oversizeWaitMarked(t *testing.T, e *env, rows []row, within time.Duration) {
	t.Helper()
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	deadline := time.Now().Add(within)
	for {
		var n int
		if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE id = ANY($1) AND published_at IS NULL`, ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered rows still unmarked after %s", n, len(rows), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
