package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// testRetention is the retention every test uses: 7 days.
const testRetention = 7 * 24 * time.Hour

// newDB starts a throwaway cluster with the outbox schema (migrations
// included) and returns its URL and a superuser connection.
func newDB(t testing.TB) (string, *pgx.Conn) {
	t.Helper()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	url := pg.URL("app")
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	return url, db
}

func mustExec(t testing.TB, db *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// fill appends n rows in enqueued_at order, 10 ms apart, 30 days ago: per
// thousand, one published a day ago ("late": expired by enqueued_at, not
// by published_at), one unpublished, one parked as poison, the rest
// published a second after they were enqueued ("expired"). Then 100
// "recent" rows published a day ago. It returns the counts per kind.
func fill(t testing.TB, db *pgx.Conn, n int) map[string]int {
	t.Helper()
	mustExec(t, db, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at, attempts, last_error)
		SELECT k, jsonb_build_object('n', g, 'event_type', 'OrderPlaced', 'body', repeat('x', 120)), at,
		       CASE k WHEN 'expired' THEN at + interval '1 second' WHEN 'late' THEN now() - interval '1 day' END,
		       CASE k WHEN 'parked' THEN 3 ELSE 0 END, CASE k WHEN 'parked' THEN 'payload is not JSON' END
		FROM (SELECT g, now() - interval '30 days' + g * interval '10 milliseconds' AS at,
		             CASE g % 1000 WHEN 0 THEN 'late' WHEN 1 THEN 'unpublished' WHEN 2 THEN 'parked' ELSE 'expired' END AS k
		      FROM generate_series(1, $1::int) g) s
		ORDER BY at`, n)
	mustExec(t, db, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'recent', '{}', now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 100)`)
	mustExec(t, db, `VACUUM ANALYZE event_outbox`)
	return kinds(t, db)
}

// kinds counts the rows per routing key.
func kinds(t testing.TB, db *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT routing_key, count(*)::int FROM event_outbox GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var k string
		var c int
		if err := rows.Scan(&k, &c); err != nil {
			t.Fatal(err)
		}
		out[k] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkKept fails unless every expired row is gone and every other row is
// still there, the parked and unpublished ones still unpublished.
func checkKept(t testing.TB, db *pgx.Conn, before map[string]int) {
	t.Helper()
	after := kinds(t, db)
	for k, n := range before {
		want := n
		if k == "expired" {
			want = 0
		}
		if after[k] != want {
			t.Fatalf("%s rows: %d left of %d, want %d (before %v, after %v)", k, after[k], n, want, before, after)
		}
	}
	var published int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE routing_key IN ('unpublished', 'parked') AND published_at IS NOT NULL`).Scan(&published); err != nil || published != 0 {
		t.Fatalf("unpublished or parked rows changed: %d published (%v)", published, err)
	}
}

// newTestRetention returns a Retention on url with a log kept in logs.
func newTestRetention(url string, batch int, logs io.Writer) (*Retention, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	r := New(Options{DatabaseURL: url, Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}, Retention: testRetention,
		Interval: time.Hour, Batch: batch}, slog.New(slog.NewTextHandler(logs, nil)), reg)
	return r, reg
}

// plan is the part of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) the tests read.
type plan struct {
	Hit   int64  `json:"Shared Hit Blocks"`
	Read  int64  `json:"Shared Read Blocks"`
	Type  string `json:"Node Type"`
	Index string `json:"Index Name"`
	Plans []plan `json:"Plans"`
}

// scans lists the indexes the plan scans and its node types ("node:Seq Scan").
func (p plan) scans() []string {
	out := []string{"node:" + p.Type}
	if p.Index != "" {
		out = append(out, p.Index)
	}
	for _, c := range p.Plans {
		out = append(out, c.scans()...)
	}
	return out
}

// explain runs sql (it executes: a DELETE deletes) under EXPLAIN (ANALYZE,
// BUFFERS) and returns the plan; the top node's buffers include its
// children's.
func explain(t testing.TB, db *pgx.Conn, sql string, args ...any) plan {
	t.Helper()
	var raw []byte
	if err := db.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var out []struct {
		Plan plan `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	return out[0].Plan
}

// batchBuffers runs a whole pass batch by batch under EXPLAIN, the way
// byIndex (or byBlocks when blocks) runs it, and returns the shared
// buffers (hit + read) each batch touched and the indexes and node types
// of their plans.
func batchBuffers(t testing.TB, db *pgx.Conn, r *Retention, blocks bool) ([]int64, map[string]bool) {
	t.Helper()
	ctx := context.Background()
	var bufs []int64
	used := map[string]bool{}
	record := func(p plan) {
		bufs = append(bufs, p.Hit+p.Read)
		for _, ix := range p.scans() {
			used[ix] = true
		}
	}
	if blocks {
		n, per, err := r.blocks(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		for lo := int64(0); lo < n; lo += per {
			record(explain(t, db, r.blockBatchSQL(true), tid(lo), tid(lo+per), testRetention))
		}
		return bufs, used
	}
	cursor := oldest
	for {
		// What the batch finds, read first (EXPLAIN returns no rows).
		var found int64
		var last pgtype.Timestamptz
		err := db.QueryRow(ctx, `SELECT count(*), max(enqueued_at)::timestamptz FROM (`+r.indexSelectSQL()+`) b`,
			cursor, testRetention, r.opts.Batch).Scan(&found, &last)
		if err != nil {
			t.Fatal(err)
		}
		record(explain(t, db, r.indexBatchSQL(), cursor, testRetention, r.opts.Batch))
		if found < int64(r.opts.Batch) {
			return bufs, used
		}
		cursor = last
	}
}

// flat fails unless no batch read more than a small multiple of the median
// batch: the cost of a batch must not grow with the batches before it.
func flat(t testing.TB, what string, bufs []int64) (median, highest int64) {
	t.Helper()
	if len(bufs) < 10 {
		t.Fatalf("%s: only %d batches; the test needs more to see a trend", what, len(bufs))
	}
	sorted := append([]int64(nil), bufs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	median, highest = sorted[len(sorted)/2], sorted[len(sorted)-1]
	if highest > 3*median {
		t.Fatalf("%s: buffers per batch grow: median %d, highest %d; per batch %v", what, median, highest, bufs)
	}
	return median, highest
}

// summary is the first, middle and last of a series, for the log.
func summary(bufs []int64) string {
	if len(bufs) == 0 {
		return "none"
	}
	return fmt.Sprintf("first %d, middle %d, last %d (%d batches)", bufs[0], bufs[len(bufs)/2], bufs[len(bufs)-1], len(bufs))
}

// deleted reads the deleted-rows counter.
func deleted(r *Retention) float64 { return counterValue(r.m.deleted) }

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
