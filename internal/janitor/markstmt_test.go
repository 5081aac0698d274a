package janitor

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMarkStatement runs the mark statement against PostgreSQL:
// a batch whose rows all exist (the missing-ids lookup is skipped), one
// with a row already marked (counts as seen) and one with an id that has
// no row (named missing): skipping the lookup when every row was marked
// never hides a missing row.
func TestIntegrationMarkStatement(t *testing.T) {
	ctx := context.Background()
	j, db := markJanitor(t, `CREATE TABLE event_outbox (id uuid PRIMARY KEY, published_at timestamptz);
		INSERT INTO event_outbox (id) SELECT ('00000000-0000-0000-0000-00000000000' || g)::uuid FROM generate_series(1, 5) g`)
	if strings.Contains(j.markSQL, "DISTINCT") {
		t.Errorf("the id is the primary key, yet the mark statement counts distinct ids (a sort per batch):\n%s", j.markSQL)
	}
	id := func(n int) string { return "00000000-0000-0000-0000-00000000000" + string(rune('0'+n)) }
	batch := func(ns ...int) []entry {
		var es []entry
		for _, n := range ns {
			es = append(es, entry{id: id(n)})
		}
		return es
	}
	for _, tc := range []struct {
		name    string
		batch   []entry
		marked  int
		missing []string
	}{
		{"all found", batch(1, 2), 2, nil},
		{"one already marked", batch(2, 3), 1, nil},
		{"one without a row", batch(4, 9), 1, []string{id(9)}},
		{"only missing", batch(8), 0, []string{id(8)}},
	} {
		before := value(j.metrics.marked)
		unseen, err := j.markBatch(ctx, tc.batch)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for k := range unseen {
			got = append(got, k)
		}
		slices.Sort(got)
		if n := int(value(j.metrics.marked) - before); n != tc.marked || !slices.Equal(got, tc.missing) {
			t.Errorf("%s: marked %d, missing %v; want %d, %v", tc.name, n, got, tc.marked, tc.missing)
		}
	}
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("unmarked rows %d (%v), want 1 (row 5)", left, err)
	}
}

// TestIntegrationMarkStatementPlan: with statistics taken before a backlog
// (the planner believes the partial index on unpublished rows is nearly
// empty), the mark statement never walks that index, which would make
// every batch of a backlog read the whole backlog.
func TestIntegrationMarkStatementPlan(t *testing.T) {
	ctx := context.Background()
	j, db := markJanitor(t, `CREATE TABLE event_outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
			enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz);
		CREATE INDEX event_outbox_unpublished_idx ON event_outbox (enqueued_at) WHERE published_at IS NULL;
		INSERT INTO event_outbox (published_at) SELECT now() FROM generate_series(1, 60000);
		ANALYZE event_outbox;
		INSERT INTO event_outbox (enqueued_at) SELECT now() FROM generate_series(1, 20000)`)
	var ids []string
	rows, err := db.Query(ctx, `SELECT id::text FROM event_outbox WHERE published_at IS NULL ORDER BY enqueued_at OFFSET 5000 LIMIT 1000`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) != 1000 {
		t.Fatalf("%d ids (%v)", len(ids), err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	explained, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+j.markSQL, ids)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(explained, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	// The planner may still prefer one pass over a small table to 1,000
	// probes of the primary key; what must never happen is the walk of the
	// backlog's index, whose cost the stale statistics hide.
	if strings.Contains(text, "event_outbox_unpublished_idx") {
		t.Fatalf("the mark statement walks the index of unpublished rows:\n%s", text)
	}
}

// markJanitor starts a throwaway cluster, runs setup (which creates
// event_outbox) in its postgres database, and returns a janitor on that
// table with its statements built, and a connection of the test's own.
func markJanitor(t *testing.T, setup string) (*Janitor, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	url := pg.URL("postgres")
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(ctx) })
	if _, err := db.Exec(ctx, setup); err != nil {
		t.Fatal(err)
	}
	j := New(Options{DatabaseURL: url, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id"}}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	t.Cleanup(j.closeDB)
	if err := j.connect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := j.statements(ctx); err != nil {
		t.Fatal(err)
	}
	return j, db
}

// TestIntegrationMarkStatementIDNotUnique: nothing makes the id column
// unique on a table without a primary key on it (a partitioned outbox's
// key must include the partition key). Two rows of one id marked by the
// UPDATE must not stand in for an id whose row the statement cannot see:
// that id is named missing, retried, and only then counted as gone.
func TestIntegrationMarkStatementIDNotUnique(t *testing.T) {
	ctx := context.Background()
	j, db := markJanitor(t, `CREATE TABLE event_outbox (id text NOT NULL, published_at timestamptz);
		INSERT INTO event_outbox (id) VALUES ('twice'), ('twice'), ('once')`)
	// 'late' is committed by a transaction still open: the janitor's
	// snapshot cannot see it, as with a row acked before its commit is
	// visible to other sessions.
	late, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if _, err := late.Exec(ctx, `INSERT INTO event_outbox (id) VALUES ('late')`); err != nil {
		t.Fatal(err)
	}
	unseen, err := j.markBatch(ctx, []entry{{id: "twice"}, {id: "late"}})
	if !strings.Contains(j.markSQL, "count(DISTINCT") {
		t.Errorf("no unique index on the id, yet the mark statement counts rows:\n%s", j.markSQL)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := value(j.metrics.marked); got != 2 || len(unseen) != 1 || !unseen["late"] {
		t.Fatalf("marked %v rows, missing %v; want 2 rows ('twice' twice) and 'late' missing", got, unseen)
	}
	// A batch whose distinct ids are all marked still skips nothing it
	// should not: 'once' is marked, nothing is missing.
	if unseen, err = j.markBatch(ctx, []entry{{id: "once"}}); err != nil || len(unseen) != 0 {
		t.Fatalf("missing %v (%v), want none", unseen, err)
	}
}

// openInsert inserts a row of id in a transaction it leaves open (rolled
// back when the test ends) and returns it with its 32-bit xid, as
// logical decoding reports it.
func openInsert(t *testing.T, db *pgx.Conn, id string) (pgx.Tx, uint32) {
	t.Helper()
	ctx := context.Background()
	open, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = open.Rollback(ctx) })
	var xid uint32
	if err := open.QueryRow(ctx, `INSERT INTO event_outbox (id) VALUES ($1) RETURNING (pg_current_xact_id()::text::bigint % 4294967296)::bigint`, id).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return open, xid
}

// TestIntegrationStillRunning: the question the janitor asks before it
// counts an unseen row as gone, against a real server: a transaction that
// is still open (as a commit waiting for a synchronous standby still is to
// other sessions) is running; once it commits it is not, nor is a long
// committed one.
func TestIntegrationStillRunning(t *testing.T) {
	ctx := context.Background()
	j, db := markJanitor(t, `CREATE TABLE event_outbox (id text PRIMARY KEY, published_at timestamptz)`)
	var old uint32
	if err := db.QueryRow(ctx, `INSERT INTO event_outbox (id) VALUES ('old') RETURNING (pg_current_xact_id()::text::bigint % 4294967296)::bigint`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	open, xid := openInsert(t, db, "late")
	batch := []entry{{id: "old", xid: old}, {id: "late", xid: xid}, {id: "snapshot-row"}}
	unseen := map[string]bool{"old": true, "late": true, "snapshot-row": true}
	running, err := j.stillRunning(ctx, batch, unseen)
	if err != nil {
		t.Fatal(err)
	}
	if !running[xid] || running[old] || len(running) != 1 {
		t.Fatalf("running %v; want only the open transaction %d (not %d)", running, xid, old)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if running, err = j.stillRunning(ctx, batch, unseen); err != nil || len(running) != 0 {
		t.Fatalf("running %v (%v) after the commit; want none", running, err)
	}
}
