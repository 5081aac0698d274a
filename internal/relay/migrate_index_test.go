package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// TestIntegrationMigrateIndexDoesNotBlockInserts: the retention index is
// built concurrently, so migrating a live outbox never holds the services'
// inserts back. A transaction left open on the table makes the build wait;
// a plain CREATE INDEX would then queue its SHARE lock in front of every
// new INSERT, the concurrent build does not. An invalid index left by a
// failed concurrent build is dropped and built again, and a partitioned
// outbox (which cannot be indexed concurrently) still migrates.
func TestIntegrationMigrateIndexDoesNotBlockInserts(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	connect := func() *pgx.Conn {
		db, err := pgx.Connect(ctx, pg.URL("app"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close(context.Background()) })
		return db
	}
	db, holder, inserter := connect(), connect(), connect()
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(db, `CREATE TABLE event_outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), routing_key text NOT NULL,
		payload jsonb NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
		attempts int NOT NULL DEFAULT 0, last_error text)`)
	exec(db, `CREATE INDEX event_outbox_unpublished_idx ON event_outbox (enqueued_at) WHERE published_at IS NULL`)
	// An invalid index, as a failed concurrent build leaves it.
	exec(db, `CREATE INDEX event_outbox_published_idx ON event_outbox (enqueued_at) WHERE published_at IS NOT NULL`)
	exec(db, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'event_outbox_published_idx'::regclass`)

	exec(holder, `BEGIN`)
	exec(holder, `INSERT INTO event_outbox (routing_key, payload) VALUES ('held', '{}')`)
	done := make(chan error, 1)
	mctx, stop := context.WithCancel(ctx)
	go func() { done <- migrations.Apply(mctx, db) }()
	// On failure, the migration ends before the connections close.
	t.Cleanup(func() { stop(); <-done; done <- nil })
	// Wait until the build is waiting for the open transaction.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := inserter.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE query LIKE '%INDEX CONCURRENTLY%' AND pid <> pg_backend_pid() AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			done <- nil
			t.Fatalf("migrate finished (%v) while a transaction on the table was open: the index was not built concurrently", err)
		default:
		}
		if time.Now().After(deadline) {
			var activity string
			_ = inserter.QueryRow(ctx, `SELECT string_agg(format('%s %s/%s: %s', pid, wait_event_type, wait_event, left(query, 80)), E'\n')
				FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()`).Scan(&activity)
			t.Fatalf("the index build never waited for the open transaction; sessions:\n%s", activity)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	if _, err := inserter.Exec(ictx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('during', '{}')`); err != nil {
		t.Fatalf("an insert during the index build: %v (blocked by it)", err)
	}
	t.Logf("insert during the concurrent index build took %s", time.Since(began).Round(time.Millisecond))
	exec(holder, `COMMIT`)
	select {
	case err := <-done:
		done <- nil
		if err != nil {
			t.Fatalf("migrate: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("migrate did not finish after the transaction ended")
	}
	var valid bool
	if err := db.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'event_outbox_published_idx'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("retention index valid=%v (%v) after migrate", valid, err)
	}

	// A partitioned outbox in another schema: the index is built, not concurrently.
	exec(db, `CREATE SCHEMA orders`)
	exec(db, `CREATE TABLE orders.event_outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), routing_key text NOT NULL,
		payload jsonb NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
		attempts int NOT NULL DEFAULT 0, last_error text, PRIMARY KEY (id, enqueued_at)) PARTITION BY RANGE (enqueued_at)`)
	exec(db, `CREATE TABLE orders.event_outbox_all PARTITION OF orders.event_outbox DEFAULT`)
	if err := migrations.ApplyTo(ctx, db, config.Outbox{Schema: "orders", Table: "event_outbox", Publication: "orders_pub"}); err != nil {
		t.Fatalf("migrate a partitioned outbox: %v", err)
	}
	var indexed bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = 'orders' AND indexname = 'event_outbox_published_idx')`).Scan(&indexed); err != nil || !indexed {
		t.Fatalf("partitioned outbox: retention index missing (%v)", err)
	}
}
