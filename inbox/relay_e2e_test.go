package inbox_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// e2eKey is the routing key of every event of the end-to-end test: one
// key, so the inbox orders all of them against each other.
const e2eKey = "orders.e2e"

// TestIntegrationRelayToInbox: the relay as shipped (relay, janitor,
// retention, monitor, in this process) streams outbox rows committed in
// three transactions to the broker, and a consumer on package inbox
// handles them. Each effect is applied exactly once, in commit order: the
// inbox reads the relay's commit LSN and index headers (valid, strictly
// increasing, first then next for the one routing key) and they match the
// rows' transactions. Then the slot is dropped, so the next relay adopts
// it and publishes every row again from its snapshot: the inbox acks those
// copies as duplicates and applies nothing twice.
func TestIntegrationRelayToInbox(t *testing.T) {
	t.Parallel()
	w := relaytest.NewWorld(t, relaytest.Options{Exchange: "inbox_e2e", Queue: "inbox_e2e_seen"})
	ctx := t.Context()
	relayURL := relayRole(t, w)
	ib, db := e2eInbox(t, w)
	msgs := e2eQueue(t, w)
	vars := relaytest.Vars(relayURL, w.AMQPURL, w.Exchange, map[string]string{"BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s"})
	r := relaytest.Start(t, relaytest.Config(t, vars), relaytest.InProcessOptions{LogTo: tWriter{t}})
	t.Cleanup(func() { _ = r.Stop() })
	r.WaitStreaming(t)

	var txs [][]string
	for n := range 3 {
		txs = append(txs, insertCommitted(t, w.DB, n+2))
	}
	var ids []string
	var prev inbox.Position
	for _, tx := range txs {
		for index, want := range tx {
			ev := handleOnce(t, ib, next(t, msgs))
			checkInOrder(t, len(ids), want, ev, prev)
			if ev.Position.TxIndex != int64(index) || (index > 0 && ev.Position.CommitLSN != prev.CommitLSN) {
				t.Errorf("%s at %s/%d: want index %d in the transaction of the event before", want, ev.Position.LSNText(), ev.Position.TxIndex, index)
			}
			prev = ev.Position
			ids = append(ids, want)
		}
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}

	// A new slot: the adoption publishes every row again (duplicates).
	// The walsender of the stopped relay exits on its own time.
	waitFor(t, 30*time.Second, "the slot is released", func() bool {
		var active bool
		err := w.DB.QueryRow(ctx, `SELECT bool_or(active) FROM pg_replication_slots WHERE database = 'app'`).Scan(&active)
		return err == nil && !active
	})
	if _, err := w.DB.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = 'app'`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.DB.Exec(ctx, `UPDATE event_outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	again := relaytest.Start(t, relaytest.Config(t, vars), relaytest.InProcessOptions{LogTo: tWriter{t}})
	t.Cleanup(func() { _ = again.Stop() })
	for range ids {
		d := next(t, msgs)
		res, err := ib.Handle(ctx, d, "e2e", insertEffect)
		if res != inbox.Duplicate || err != nil {
			t.Errorf("%s published again: %v, %v; want a duplicate", d.MessageId, res, err)
		}
	}
	checkOnce(t, db, ids)
}

// checkInOrder: the i-th handled event is the i-th row committed, and the
// inbox read a valid position above the one before it.
func checkInOrder(t *testing.T, i int, want string, ev inbox.Event, prev inbox.Position) {
	t.Helper()
	if ev.MessageID != want {
		t.Errorf("delivery %d is %s, want %s (commit order)", i, ev.MessageID, want)
	}
	if !ev.Position.Valid {
		t.Fatalf("delivery %d (%s): the inbox found no commit LSN and index in %v", i, ev.MessageID, ev.Delivery.Headers)
	}
	wantOrder := inbox.OrderNext
	if i == 0 {
		wantOrder = inbox.OrderFirst
	} else if !prev.Less(ev.Position) {
		t.Errorf("delivery %d (%s) at %s/%d, not after %s/%d", i, ev.MessageID, ev.Position.LSNText(), ev.Position.TxIndex, prev.LSNText(), prev.TxIndex)
	}
	if ev.Order != wantOrder {
		t.Errorf("delivery %d (%s): order %v, want %v", i, ev.MessageID, ev.Order, wantOrder)
	}
}

// handleOnce hands d to the inbox, whose handler applies its effect, and
// returns the event the handler saw.
func handleOnce(t *testing.T, ib *inbox.Inbox, d amqp.Delivery) inbox.Event {
	t.Helper()
	var ev inbox.Event
	res, err := ib.Handle(t.Context(), d, "e2e", func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
		ev = e
		return insertEffect(ctx, tx, e)
	})
	if res != inbox.Handled || err != nil {
		t.Fatalf("%s: %v, %v; want handled", d.MessageId, res, err)
	}
	return ev
}

// checkOnce: each row's effect exists exactly once.
func checkOnce(t *testing.T, ledger *pgx.Conn, ids []string) {
	t.Helper()
	counts := map[string]int{}
	rows, err := ledger.Query(t.Context(), `SELECT message_id, count(*) FROM effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		counts[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("the effect of %s applied %d times, want once", id, counts[id])
		}
	}
	if len(counts) != len(ids) {
		t.Errorf("effects of %d events, want %d", len(counts), len(ids))
	}
}

// insertCommitted commits n rows in one transaction and returns their ids
// in insertion order.
func insertCommitted(t *testing.T, db *pgx.Conn, n int) []string {
	t.Helper()
	ctx := t.Context()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := relaytest.Insert(ctx, tx, e2eKey, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return relaytest.IDs(rows)
}

// e2eInbox is an inbox on a consumer database of its own in the test's
// cluster, with the ledger and an effects table without a unique
// constraint (an effect applied twice shows as two rows).
func e2eInbox(t *testing.T, w *relaytest.World) (*inbox.Inbox, *pgx.Conn) {
	t.Helper()
	ctx := t.Context()
	if err := w.PG.CreateDatabase(ctx, "consumer"); err != nil {
		t.Fatal(err)
	}
	db := relaytest.Connect(t, w.PG.URL("consumer"))
	if err := inbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE effects (message_id TEXT NOT NULL, attempt INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(relaytest.Connect(t, w.PG.URL("consumer")), inbox.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return ib, db
}

// e2eQueue is a queue of the test's own bound to the relay's exchange,
// consumed with manual acks (the inbox acks) one message at a time.
func e2eQueue(t *testing.T, w *relaytest.World) <-chan amqp.Delivery {
	t.Helper()
	_, ch := testenv.MustChannel(t, w.AMQPURL)
	queue := testenv.UniqueName("inbox_e2e")
	if _, err := ch.QueueDeclare(queue, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", w.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// relayRole creates the least-privilege role of docs/least-privilege.md
// and returns the URL the relay connects with: the relay never runs as a
// superuser in a test.
func relayRole(t *testing.T, w *relaytest.World) string {
	t.Helper()
	const password = "e2e-Relay-pw"
	if _, err := w.DB.Exec(t.Context(), fmt.Sprintf(`
		CREATE ROLE cdcrelay_app LOGIN REPLICATION PASSWORD '%s';
		GRANT SELECT, DELETE ON event_outbox TO cdcrelay_app;
		GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO cdcrelay_app;`, password)); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(w.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("cdcrelay_app", password)
	return u.String()
}
