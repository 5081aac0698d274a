//go:build retentionbench

package retention

// The 1,000,000-row retention measurement in docs/performance.md. It takes
// a few minutes, so it is kept out of `make test`:
//
//	go test -tags retentionbench -run TestIntegrationRetentionMillion -v -timeout 60m ./internal/retention/
//
// -retention.rows sets the row count.

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

var benchRows = flag.Int("retention.rows", 1000000, "expired rows TestIntegrationRetentionMillion deletes")

// oldRetentionSQL is the statement the janitor ran before retention had a
// stage and an index of its own, measured here for comparison.
const oldRetentionSQL = `DELETE FROM public.event_outbox WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM public.event_outbox WHERE published_at < now() - $1::interval LIMIT $2))`

func TestIntegrationRetentionMillion(t *testing.T) {
	url, db := newDB(t)
	ctx := context.Background()
	const batch = 5000 // CDCRELAY_RETENTION_BATCH's default

	// Buffers per batch along the index, every batch under EXPLAIN.
	began := time.Now()
	before := fill(t, db, *benchRows)
	t.Logf("filled %d rows in %s", *benchRows, time.Since(began).Round(time.Second))
	r, _ := newTestRetention(url, batch, &testenv.Buffer{})
	began = time.Now()
	bufs, used := batchBuffers(t, db, r, false)
	checkKept(t, db, before)
	median, highest := flat(t, "index", bufs)
	t.Logf("index walk under EXPLAIN: %d rows in %s; buffers per batch %s, median %d, highest %d; indexes %v",
		before["expired"], time.Since(began).Round(time.Millisecond), summary(bufs), median, highest, used)

	// The same without the index: block ranges.
	mustExec(t, db, `TRUNCATE event_outbox`)
	before = fill(t, db, *benchRows)
	mustExec(t, db, `DROP INDEX event_outbox_published_idx`)
	began = time.Now()
	bufs, _ = batchBuffers(t, db, r, true)
	checkKept(t, db, before)
	median, highest = flat(t, "blocks", bufs)
	t.Logf("block walk under EXPLAIN: %d rows in %s; buffers per batch %s, median %d, highest %d",
		before["expired"], time.Since(began).Round(time.Millisecond), summary(bufs), median, highest)

	// The old statement on 200,000 rows, for comparison: without
	// synchronized scans (what a table below shared_buffers/4 gets: most
	// outboxes on a server with gigabytes of shared_buffers), then with.
	for _, sync := range []string{"off", "on"} {
		mustExec(t, db, `TRUNCATE event_outbox`)
		fill(t, db, 200000)
		mustExec(t, db, `SET synchronize_seqscans = `+sync)
		var old []int64
		for {
			var left int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at < now() - $1::interval`, testRetention).Scan(&left); err != nil {
				t.Fatal(err)
			}
			p := explain(t, db, oldRetentionSQL, testRetention, batch)
			old = append(old, p.Hit+p.Read)
			if left <= batch {
				break
			}
		}
		t.Logf("old statement, 200,000 rows, synchronize_seqscans %s: buffers per batch %s; all: %v", sync, summary(old), old)
	}
	mustExec(t, db, `RESET synchronize_seqscans`)
	mustExec(t, db, `CREATE INDEX event_outbox_published_idx ON event_outbox (enqueued_at) WHERE published_at IS NOT NULL`)

	// A real pass, timed, with a janitor marking one new event every 20 ms.
	mustExec(t, db, `TRUNCATE event_outbox`)
	before = fill(t, db, *benchRows)
	m := startMarking(t, url)
	time.Sleep(3 * time.Second) // marking latency without retention
	m.phase("during")
	began = time.Now()
	n, err := r.runOnce(ctx)
	took := time.Since(began)
	m.phase("after")
	time.Sleep(time.Second)
	m.stop()
	if err != nil {
		t.Fatal(err)
	}
	checkKept(t, db, before)
	t.Logf("pass: %d rows deleted in %s (%.0f rows/s)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	for _, phase := range []string{"before", "during", "after"} {
		t.Logf("marking %s retention: %s", phase, m.report(phase))
	}
	if len(m.lat["during"]) == 0 {
		t.Fatal("no event was marked during the retention pass")
	}
}

// marking inserts an event every 20 ms, hands its id to a janitor and
// times how long the row takes to be marked, per phase.
type marking struct {
	mu    sync.Mutex
	cur   string
	lat   map[string][]time.Duration
	stop  func()
	phase func(string)
}

func startMarking(t *testing.T, url string) *marking {
	t.Helper()
	m := &marking{cur: "before", lat: map[string][]time.Duration{}}
	m.phase = func(p string) { m.mu.Lock(); m.cur = p; m.mu.Unlock() }
	j := janitor.New(janitor.Options{DatabaseURL: url, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id"},
		MarkInterval: 100 * time.Millisecond, MarkBatch: 500}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	jbg := testenv.Go(j.Run)
	ctx, cancel := context.WithCancel(context.Background())
	// The janitor acks the events' sequence numbers on this watermark once
	// their rows are marked, as it does a streaming session's.
	positions := progress.NewWatermark(0)
	marks := j.Marks(ctx, positions)
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var id string
			if err := db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('live', '{}') RETURNING id::text`).Scan(&id); err != nil {
				return
			}
			start := time.Now()
			marks.Ack(publish.Ref{Seq: positions.NextSeq(), ID: id})
			for ctx.Err() == nil {
				var marked bool
				if err := db.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM event_outbox WHERE id = $1::uuid`, id).Scan(&marked); err != nil {
					return
				}
				if marked {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			m.mu.Lock()
			m.lat[m.cur] = append(m.lat[m.cur], time.Since(start))
			m.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	m.stop = func() {
		cancel()
		wg.Wait()
		_ = db.Close(context.Background())
		_ = jbg.Stop()
	}
	return m
}

func (m *marking) report(phase string) string {
	m.mu.Lock()
	l := append([]time.Duration(nil), m.lat[phase]...)
	m.mu.Unlock()
	if len(l) == 0 {
		return "no events"
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	q := func(f float64) time.Duration { return l[min(len(l)-1, int(f*float64(len(l))))].Round(time.Millisecond) }
	return fmtMarks(len(l), q(0.5), q(0.99), l[len(l)-1].Round(time.Millisecond))
}

func fmtMarks(n int, p50, p99, highest time.Duration) string {
	return fmt.Sprintf("%d events, insert to marked p50 %s, p99 %s, max %s", n, p50, p99, highest)
}
