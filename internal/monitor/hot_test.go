package monitor

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// hotDatabase is database with the outbox moved to the HOT layout.
func hotDatabase(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	// Prepared transactions too: one is open without a backend.
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_prepared_transactions": "2"}})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	dbURL := pg.URL("app")
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	if err := migrations.ApplyHOT(ctx, db, migrations.Default); err != nil {
		t.Fatal(err)
	}
	// The default migrations, run again, keep the layout.
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'event_outbox'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"event_outbox_enqueued_idx", "event_outbox_parked_idx", "event_outbox_pkey"}; !slices.Equal(indexes, want) {
		t.Fatalf("indexes on the HOT layout: %v, want %v", indexes, want)
	}
	return db, dbURL
}

// TestIntegrationHOTLayoutMarks: on the HOT layout a mark, the janitor's
// UPDATE of published_at, is heap-only (no index entry written): nine in
// ten at least. On the default layout none is.
func TestIntegrationHOTLayoutMarks(t *testing.T) {
	db, _ := hotDatabase(t)
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload) SELECT 'k', '{}' FROM generate_series(1, 5000)`)
	ctx := context.Background()
	// In batches of 100 by id, each its own transaction, as the janitor
	// writes them.
	for range 50 {
		exec(t, db, `UPDATE event_outbox SET published_at = now()
			WHERE id = ANY(ARRAY(SELECT id FROM event_outbox WHERE published_at IS NULL LIMIT 100)) AND published_at IS NULL`)
	}
	// The counts reach pg_stat_user_tables when the backend flushes them,
	// within seconds of going idle.
	var upd, hot int64
	waitFor(t, "the marks in pg_stat_user_tables", func() bool {
		exec(t, db, `SELECT pg_stat_clear_snapshot()`)
		if err := db.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'event_outbox'`).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		return upd >= 5000
	})
	t.Logf("marks: %d updates, %d heap-only", upd, hot)
	// A page left half free holds one new version of each of its rows, less
	// the odd one that does not fit before the page is pruned: 96% here.
	if upd != 5000 || hot < upd*9/10 {
		t.Fatalf("marks: %d updates of which %d heap-only, want 5000 and at least 90%% heap-only", upd, hot)
	}
}

// hotMonitor is a monitor the test turns by hand, one refresh per turn.
type hotMonitor struct {
	*Monitor
	reg *prometheus.Registry
}

func (m hotMonitor) refreshed(t *testing.T) map[string]float64 {
	t.Helper()
	m.turn(context.Background())
	if !m.held || m.plan == nil {
		t.Fatalf("the refresh failed (held %v, plan %v)", m.held, m.plan != nil)
	}
	return exported(t, m.reg)
}

// TestIntegrationHOTLayoutBacklog: on the HOT layout the monitor reads the
// backlog along event_outbox_enqueued_idx from its floor, and counts what a
// scan of the whole table would: a row committed by a transaction that
// began several refreshes before (its enqueued_at is its start), a row that
// stays unpublished (it holds the floor), parked rows below the floor.
func TestIntegrationHOTLayoutBacklog(t *testing.T) {
	db, dbURL := hotDatabase(t)
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	m := hotMonitor{New(Options{DatabaseURL: dbURL, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", Slot: "s1"}, Interval: time.Second},
		slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil)), reg), reg}
	defer m.drop()
	const unpublished, parked = "cdcrelay_outbox_unpublished{slot=s1}", "cdcrelay_outbox_parked{slot=s1}"
	publishedBatch := func() {
		exec(t, db, `INSERT INTO event_outbox (routing_key, payload) SELECT 'k', '{}' FROM generate_series(1, 2000)`)
		exec(t, db, `UPDATE event_outbox SET published_at = now() WHERE published_at IS NULL AND last_error IS NULL AND routing_key = 'k'`)
	}
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'old', '{}', now() - interval '2 days' + g * interval '1 ms', now() FROM generate_series(1, 50000) g`)
	exec(t, db, `ANALYZE event_outbox`)

	// The first refreshes read the whole table; then the floor settles.
	for range 3 {
		publishedBatch()
		if got := m.refreshed(t); got[unpublished] != 0 {
			t.Fatalf("unpublished %v, want 0", got[unpublished])
		}
	}
	if m.plan.bounded == "" || m.floor.at == nil {
		t.Fatalf("no bounded scan after three refreshes (bounded %q, floor %v)", m.plan.bounded, m.floor.at)
	}
	start := *m.floor.at

	// A transaction begins, and refreshes pass while it stays open: the
	// floor does not pass its start.
	long, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Close(ctx) }()
	tx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var began time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		time.Sleep(1100 * time.Millisecond) // readings a second apart, past the margin
		publishedBatch()
		m.refreshed(t)
	}
	if m.floor.at == nil || !m.floor.at.Before(began) {
		t.Fatalf("floor %v passed the start %v of a transaction still open", m.floor.at, began)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('late', '{}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := m.refreshed(t)
	if got[unpublished] != 1 {
		t.Fatalf("unpublished %v after the late row committed, want 1", got[unpublished])
	}
	if age := got["cdcrelay_oldest_unpublished_age_seconds{slot=s1}"]; age < 4 {
		t.Fatalf("oldest unpublished age %v s, want at least the 4 s the row's transaction was open", age)
	}
	exec(t, db, `UPDATE event_outbox SET published_at = now() WHERE routing_key = 'late'`)
	for range 3 {
		time.Sleep(1100 * time.Millisecond)
		publishedBatch()
		if got := m.refreshed(t); got[unpublished] != 0 {
			t.Fatalf("unpublished %v, want 0", got[unpublished])
		}
	}
	if !m.floor.at.After(began) || !m.floor.at.After(start) {
		t.Fatalf("floor %v did not move past the transaction's start %v once it ended", m.floor.at, began)
	}

	// A prepared transaction holds the floor too, though no session holds
	// it open.
	prep, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = prep.Close(ctx) }()
	var prepared time.Time
	for _, q := range []string{`BEGIN`, `INSERT INTO event_outbox (routing_key, payload) VALUES ('prepared', '{}') RETURNING enqueued_at`, `PREPARE TRANSACTION 'hot_test'`} {
		if q == `BEGIN` || q[0] == 'P' {
			exec(t, prep, q)
			continue
		}
		if err := prep.QueryRow(ctx, q).Scan(&prepared); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		time.Sleep(1100 * time.Millisecond)
		publishedBatch()
		if got := m.refreshed(t); got[unpublished] != 0 {
			t.Fatalf("unpublished %v before the prepared transaction committed, want 0", got[unpublished])
		}
	}
	if !m.floor.at.Before(prepared) {
		t.Fatalf("floor %v passed the start %v of a prepared transaction", m.floor.at, prepared)
	}
	exec(t, db, `COMMIT PREPARED 'hot_test'`)
	if got := m.refreshed(t); got[unpublished] != 1 {
		t.Fatalf("unpublished %v after the prepared transaction committed, want 1", got[unpublished])
	}
	exec(t, db, `UPDATE event_outbox SET published_at = now() WHERE routing_key = 'prepared'`)

	// A row that stays unpublished holds the floor; parked rows far below
	// it are counted all the same.
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload) VALUES ('stuck', '{}')`)
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload, enqueued_at, last_error)
		SELECT 'poison', '{}', now() - interval '1 day', 'poison' FROM generate_series(1, 3)`)
	var stuckAt time.Time
	if err := db.QueryRow(ctx, `SELECT enqueued_at FROM event_outbox WHERE routing_key = 'stuck'`).Scan(&stuckAt); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		time.Sleep(1100 * time.Millisecond)
		publishedBatch()
		got := m.refreshed(t)
		if got[unpublished] != 1 || got[parked] != 3 {
			t.Fatalf("refresh %d after the stuck row: unpublished %v, parked %v, want 1 and 3", i, got[unpublished], got[parked])
		}
	}
	if m.floor.at.After(stuckAt) {
		t.Fatalf("floor %v passed the stuck row enqueued at %v", m.floor.at, stuckAt)
	}

	// The same with the slot's health read on a server of its own (here
	// the same one): the backlog statement then takes the floor alone.
	regApart := prometheus.NewPedanticRegistry()
	apart := hotMonitor{New(Options{DatabaseURL: dbURL, SlotDatabaseURL: dbURL, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", Slot: "s2"}, Interval: time.Second},
		slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil)), regApart), regApart}
	defer apart.drop()
	for i := range 3 {
		time.Sleep(1100 * time.Millisecond)
		got := apart.refreshed(t)
		if got["cdcrelay_outbox_unpublished{slot=s2}"] != 1 || got["cdcrelay_outbox_parked{slot=s2}"] != 3 {
			t.Fatalf("refresh %d, slot apart: %v", i, got)
		}
	}
	if apart.floor.at == nil {
		t.Fatal("slot apart: no floor after three refreshes")
	}

	// The bounded statement reads the outbox along its indexes only.
	exec(t, db, `ANALYZE event_outbox`)
	scans := outboxScans(t, db, `EXPLAIN (FORMAT JSON) `+m.plan.bounded, "s1", *m.floor.at)
	b, _ := json.Marshal(scans)
	t.Logf("event_outbox read by %s", b)
	if len(scans) != 2 {
		t.Fatalf("event_outbox read by %s, want two index scans", b)
	}
	for _, s := range scans {
		if !strings.HasSuffix(s, " event_outbox_enqueued_idx") && !strings.HasSuffix(s, " event_outbox_parked_idx") {
			t.Fatalf("event_outbox read by %s, want event_outbox_enqueued_idx and event_outbox_parked_idx only", b)
		}
	}
}
