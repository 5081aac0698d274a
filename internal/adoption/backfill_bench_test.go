package adoption

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// BenchmarkIntegrationBackfill reads a whole backlog through Backfill from a real
// snapshot, events drained as fast as they come (no broker): one
// iteration is one backfill. It reports rows/s and the peak heap in use
// while it ran (sampled every 2 ms).
//
//   - 100k small rows: the common adoption, ~100 byte jsonb payloads.
//   - 300 rows of 1 MiB: large rows, where a FETCH of 500 would hold them all.
func BenchmarkIntegrationBackfill(b *testing.B) {
	pg := testenv.MustPostgres(b, testenv.PostgresOptions{})
	for _, bc := range []struct {
		name, db   string
		rows, size int
	}{
		{"100k small rows", "small", 100_000, 100},
		{"300 rows of 1 MiB", "large", 300, 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			db := backfillBenchSeed(b, pg, bc.db, bc.rows, bc.size)
			holder := backfillBenchConnect(b, pg.URL(bc.db))
			m := wal.Mapping{Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload"}, MaxMessageBytes: 16 << 20}
			var rows int
			var took time.Duration
			var peak atomic.Uint64
			stop := backfillBenchSampleHeap(&peak)
			defer stop()
			for b.Loop() {
				began := time.Now()
				rows += backfillBenchOnce(b, db, holder, m)
				took += time.Since(began)
			}
			b.ReportMetric(float64(rows)/took.Seconds(), "rows/s")
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
		})
	}
}

// backfillBenchSeed fills event_outbox of a new database with n rows of
// about size bytes.
func backfillBenchSeed(b *testing.B, pg *testenv.Postgres, name string, n, size int) *pgx.Conn {
	b.Helper()
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, name); err != nil {
		b.Fatal(err)
	}
	db := backfillBenchConnect(b, pg.URL(name))
	if err := migrations.Apply(ctx, db); err != nil {
		b.Fatal(err)
	}
	for left := n; left > 0; left -= 1000 {
		if _, err := db.Exec(ctx, `
			INSERT INTO event_outbox (routing_key, payload)
			SELECT 'bench.k', jsonb_build_object('event_type', 'BenchEvent', 'n', g, 'pad', repeat(md5(g::text), $1 / 32))
			FROM generate_series(1, $2) g`, size, min(left, 1000)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, `VACUUM ANALYZE event_outbox`); err != nil {
		b.Fatal(err)
	}
	return db
}

// backfillBenchOnce backfills the whole table from a snapshot exported by
// holder and returns the rows read.
func backfillBenchOnce(b *testing.B, db, holder *pgx.Conn, m wal.Mapping) int {
	b.Helper()
	ctx := context.Background()
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var snapshot string
	if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		b.Fatal(err)
	}
	out := make(chan wal.Event)
	done := make(chan int)
	go func() {
		n := 0
		for range out {
			n++
		}
		done <- n
	}()
	if _, err := Backfill(ctx, db, slot.Created{Snapshot: snapshot}, m, &backfillBenchSeq{}, out, nil); err != nil {
		b.Fatal(err)
	}
	return <-done
}

// backfillBenchSampleHeap records the largest HeapInuse into peak until
// the returned function is called.
func backfillBenchSampleHeap(peak *atomic.Uint64) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()
	return func() { close(stop) }
}

type backfillBenchSeq struct{ n uint64 }

func (s *backfillBenchSeq) NextSeq() uint64 { s.n++; return s.n }

func backfillBenchConnect(b *testing.B, url string) *pgx.Conn {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
