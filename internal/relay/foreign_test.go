package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// foreignSkippedMetric counts the foreign inserts the relay skipped.
const foreignSkippedMetric = "cdcrelay_foreign_inserts_skipped_total"

// foreignWarning is the start of the warning that names a skipped table.
const foreignWarning = "skipping inserts into public.orders"

// addOrders creates table orders and adds it to the relay's publication.
func addOrders(t *testing.T, e *env) {
	t.Helper()
	if _, err := e.db.Exec(context.Background(), `CREATE TABLE orders (id int PRIMARY KEY); ALTER PUBLICATION cdcrelay_outbox ADD TABLE orders`); err != nil {
		t.Fatal(err)
	}
}

// mixedTx commits one transaction that inserts order n into orders, then
// one outbox row, and returns that row with the WAL position after the
// commit.
func mixedTx(t *testing.T, e *env, n int) (row, pglogrepl.LSN) {
	t.Helper()
	ctx := context.Background()
	var rw row
	err := pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, n); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('identity.k', '{"event_type": "TestEvent"}')
			RETURNING id::text, routing_key, payload::text`).Scan(&rw.id, &rw.key, &rw.payload)
	})
	if err != nil {
		t.Fatal(err)
	}
	var after pglogrepl.LSN
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	return rw, after
}

// foreignSkipped checks that the relay streams on, past committed, with
// skipped foreign inserts counted, the warning logged once per session and
// restarts sessions restarted.
func foreignSkipped(t *testing.T, e *env, r *running, committed pglogrepl.LSN, skipped float64, restarts float64) {
	t.Helper()
	testenv.WaitConfirmed(t, e.db, slotName, committed, 30*time.Second)
	if n := gauge(t, r.reg, foreignSkippedMetric); n != skipped {
		t.Fatalf("%s = %v, want %v", foreignSkippedMetric, n, skipped)
	}
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != restarts {
		t.Fatalf("%v restarts, want %v:\n%s", n, restarts, r.logs.String())
	}
	if n := strings.Count(r.logs.String(), foreignWarning); n != 1 {
		t.Fatalf("%d warnings %q, want 1 (once per relation and session):\n%s", n, foreignWarning, r.logs.String())
	}
	if !r.relay.Streaming() {
		t.Fatal("the relay stopped streaming")
	}
}

// TestIntegrationForeignTableMidStreamSkipped: a table (orders) added to
// the relay's publication while it streams. The session knows nothing of
// it, so its first insert ends the session before that transaction is
// confirmed (ErrRelationUnknown, not fatal); the next session start reads
// the publication again, finds orders foreign (not the outbox, nor of its
// tree), and skips its row: the outbox row of the same transaction is
// delivered, the slot moves past it, a warning names public.orders, the
// metric counts 1, and there was exactly one restart. Later foreign rows
// are skipped without a restart.
func TestIntegrationForeignTableMidStreamSkipped(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	before, committed := identityInsert(t, e.db, "event_outbox", "id", "routing_key", "", 3)
	identityWaitDelivered(t, e, before, committed, 30*time.Second)
	addOrders(t, e)

	mixed, committed := mixedTx(t, e, 1)
	identityWaitDelivered(t, e, []row{mixed}, committed, 60*time.Second)
	foreignSkipped(t, e, r, committed, 1, 1)
	if !strings.Contains(r.logs.String(), wal.ErrRelationUnknown.Error()) {
		t.Fatalf("no session ended on the unknown relation:\n%s", r.logs.String())
	}

	later, committed := mixedTx(t, e, 2)
	identityWaitDelivered(t, e, []row{later}, committed, 30*time.Second)
	foreignSkipped(t, e, r, committed, 2, 1)
	report(t, append(before, mixed, later), e.consumer.Deliveries())
	identityWaitMarked(t, e.db, "event_outbox", 30*time.Second)
}

// TestIntegrationForeignTableAtStart: a publication that already holds
// orders when the relay starts is streamed (no longer refused): orders'
// inserts are skipped from the first session, without a restart, and the
// outbox's events flow.
func TestIntegrationForeignTableAtStart(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	addOrders(t, e)
	r := e.startRelay(nil)
	r.waitStreaming(t)
	mixed, committed := mixedTx(t, e, 1)
	identityWaitDelivered(t, e, []row{mixed}, committed, 30*time.Second)
	foreignSkipped(t, e, r, committed, 1, 0)
	identityWaitMarked(t, e.db, "event_outbox", 30*time.Second)
}

// TestIntegrationUnknownRelationLeftPublication: orders was in the
// publication when its row was committed, and left it before the relay
// started. The first session cannot classify the row (ErrRelationUnknown);
// the next start classifies the remembered relation from the catalog:
// still there and not of the outbox's tree, it is foreign and skipped.
// Once the table is gone, nothing can tell it from the outbox: the relay
// stops (fatal ErrPublication naming it) before confirming past it.
func TestIntegrationUnknownRelationLeftPublication(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	r := e.startRelay(nil)
	r.waitStreaming(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	addOrders(t, e)
	mixed, committed := mixedTx(t, e, 1)
	if _, err := e.db.Exec(ctx, `ALTER PUBLICATION cdcrelay_outbox DROP TABLE orders`); err != nil {
		t.Fatal(err)
	}
	r = e.startRelay(nil)
	identityWaitDelivered(t, e, []row{mixed}, committed, 60*time.Second)
	foreignSkipped(t, e, r, committed, 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	if _, err := e.db.Exec(ctx, `ALTER PUBLICATION cdcrelay_outbox ADD TABLE orders`); err != nil {
		t.Fatal(err)
	}
	gone, committed := mixedTx(t, e, 2)
	if _, err := e.db.Exec(ctx, `DROP TABLE orders`); err != nil {
		t.Fatal(err)
	}
	r = e.startRelay(nil)
	err := r.Wait(t, 60*time.Second, "the relay to stop at a row of a relation that no longer exists")
	if !errors.Is(err, slot.ErrPublication) || !strings.Contains(err.Error(), "public.orders") || !strings.Contains(err.Error(), "no longer exists") {
		t.Fatalf("relay ended with %v, want ErrPublication naming public.orders, gone", err)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got >= committed {
		t.Fatalf("slot confirmed %s, past the row of the dropped relation (%s)", got, committed)
	}
	t.Logf("left the publication: skipped after one restart; dropped: %q (outbox row %s waits)", err, gone.id)
}

// TestIntegrationRecreatedOutboxMidStreamStops: with a foreign table in
// the publication, the outbox dropped and created again under its name
// (another OID) mid-stream is still not skipped: its first row stops the
// relay (fatal wal.ErrNotOutbox) before that transaction is confirmed.
// (This passed before foreign tables were skipped too: it guards the
// line between the two.)
func TestIntegrationRecreatedOutboxMidStreamStops(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	addOrders(t, e)
	r := e.startRelay(nil)
	r.waitStreaming(t)
	mixed, committed := mixedTx(t, e, 1)
	identityWaitDelivered(t, e, []row{mixed}, committed, 30*time.Second)
	identityWaitMarked(t, e.db, "event_outbox", 30*time.Second)
	if _, err := e.db.Exec(ctx, `CREATE TABLE event_outbox_new (LIKE event_outbox INCLUDING ALL);
		DROP TABLE event_outbox; ALTER TABLE event_outbox_new RENAME TO event_outbox;
		ALTER PUBLICATION cdcrelay_outbox ADD TABLE event_outbox`); err != nil {
		t.Fatal(err)
	}
	_, committed = mixedTx(t, e, 2)
	err := r.Wait(t, 30*time.Second, "the relay to stop at a row of the recreated outbox")
	if !errors.Is(err, wal.ErrNotOutbox) || !strings.Contains(err.Error(), "public.event_outbox") {
		t.Fatalf("relay ended with %v, want ErrNotOutbox naming public.event_outbox", err)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got >= committed {
		t.Fatalf("slot confirmed %s, past the recreated outbox's row (%s)", got, committed)
	}
	time.Sleep(time.Second) // a late delivery would show here
	if n := e.consumer.Count(); n != 1 {
		t.Fatalf("%d messages, want only the one before the outbox was recreated", n)
	}
}
