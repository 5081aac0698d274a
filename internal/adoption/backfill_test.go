package adoption

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

func TestNextFetch(t *testing.T) {
	const kib, mib = 1 << 10, 1 << 20
	if backfillFetchBytes != 4*mib || backfillBatch != 500 || backfillFirstFetch != 16 {
		t.Fatal("the table below assumes FETCHes of 16 to 500 rows aiming at 4 MiB")
	}
	tests := []struct {
		name       string
		asked, got int
		bytes      int64
		want       int
	}{
		{"small rows grow fourfold", 16, 16, 16 * 200, 64},
		{"then to a power of two", 64, 64, 64 * 200, 256},
		{"then to the cap", 256, 256, 256 * 200, backfillBatch},
		{"never above the cap", backfillBatch, backfillBatch, backfillBatch * 200, backfillBatch},
		{"1 MiB rows: four at a time", 16, 16, 16 * mib, 4},
		{"rows above the target: still one", 1, 1, 64 * mib, 1},
		{"large rows shrink at once", backfillBatch, backfillBatch, backfillBatch * 100 * kib, 32},
		{"growth from one row is fourfold", 1, 1, 100, 4},
		{"rounded down to a power of two", 256, 256, 256 * 20 * kib, 128},
		{"no bytes counted", 16, 16, 0, 64},
		{"nothing read", 16, 0, 0, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextFetch(tt.asked, tt.got, tt.bytes); got != tt.want {
				t.Fatalf("nextFetch(%d, %d, %d) = %d, want %d", tt.asked, tt.got, tt.bytes, got, tt.want)
			}
		})
	}
}

// TestNextFetchBoundsBytes: whatever the row sizes, a FETCH sized from the
// last one asks for at most backfillFetchBytes of rows of the last one's
// average size (or one row), and for at most backfillBatch rows.
func TestNextFetchBoundsBytes(t *testing.T) {
	for _, size := range []int64{1, 100, 2 << 10, 300 << 10, 1 << 20, 16 << 20, 1 << 30} {
		for _, asked := range []int{1, 16, 100, 256, backfillBatch} {
			n := nextFetch(asked, asked, size*int64(asked))
			if n < 1 || n > backfillBatch || n > 4*asked {
				t.Fatalf("rows of %d bytes after %d: next FETCH %d", size, asked, n)
			}
			if n > 1 && int64(n)*size > backfillFetchBytes {
				t.Fatalf("rows of %d bytes after %d: next FETCH %d, %d bytes", size, asked, n, int64(n)*size)
			}
		}
	}
}

type backfillTestSeq struct{ n uint64 }

func (s *backfillTestSeq) NextSeq() uint64 { s.n++; return s.n }

// TestIntegrationBackfillByBytes runs Backfill against a real snapshot of
// a backlog of small rows, 120 KiB rows, a row whose payload is above
// MaxMessageBytes, a row whose payload fits but whose headers push it
// above, and a NULL payload. Every row arrives once, in order, numbered;
// oversize rows come as poison naming their size, without their values;
// and the server log shows FETCH sizes that follow the bytes: 16 first,
// then as many 120 KiB rows as fit in backfillFetchBytes, up to 500 small
// rows.
func TestIntegrationBackfillByBytes(t *testing.T) {
	const (
		kib   = 1 << 10
		limit = 1 << 20
	)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"log_statement": "all"}})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	db := backfillTestConnect(t, pg.URL("app"))
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE outbox (id text PRIMARY KEY, routing_key text NOT NULL, payload text, headers jsonb,
		enqueued_at timestamptz NOT NULL, published_at timestamptz)`)
	// Each group gets its own enqueued_at, so the backlog's order is known.
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []string
	group := func(prefix string, n int, payload string, headers *string) {
		t.Helper()
		at = at.Add(time.Second)
		for i := range n {
			id := fmt.Sprintf("%s-%04d", prefix, i)
			exec(`INSERT INTO outbox VALUES ($1, 'k', $2, $3, $4, NULL)`, id, payload, headers, at)
			want = append(want, id)
		}
	}
	big := strings.Repeat("b", 120*kib)
	heavy := fmt.Sprintf(`{"h": "%s"}`, strings.Repeat("h", 400*kib))
	group("a-small", backfillFirstFetch, "small", nil)
	group("b-big", 100, big, nil)
	group("c-oversize", 1, strings.Repeat("o", 3*limit), nil)
	group("d-heavy", 1, strings.Repeat("p", 700*kib), &heavy)
	exec(`INSERT INTO outbox VALUES ('e-null', 'k', NULL, NULL, $1, NULL)`, at.Add(time.Second))
	want = append(want, "e-null")
	at = at.Add(time.Second)
	group("f-small", 1200, "small", nil)
	exec(`INSERT INTO outbox VALUES ('z-done', 'k', 'x', NULL, $1, now())`, at.Add(time.Second))

	// A snapshot exported by a transaction held open stands in for the
	// slot's.
	holder := backfillTestConnect(t, pg.URL("app"))
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var snapshot string
	if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		t.Fatal(err)
	}
	// A row committed after the snapshot is not in the backfill.
	exec(`INSERT INTO outbox VALUES ('y-later', 'k', 'x', NULL, $1, NULL)`, at)

	m := wal.Mapping{Outbox: config.Outbox{Schema: "public", Table: "outbox", IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload", HeadersColumn: "headers"}, MaxMessageBytes: limit}
	c := slot.Created{ConsistentPoint: pglogrepl.LSN(0x16B3748), Snapshot: snapshot}
	out := make(chan wal.Event, 2000)
	var total int64
	n, err := Backfill(ctx, db, c, m, &backfillTestSeq{}, out, func(n int64) { total = n })
	if err != nil {
		t.Fatal(err)
	}
	var got []wal.Event
	for ev := range out {
		got = append(got, ev)
	}
	if n != len(want) || len(got) != len(want) || total != int64(len(want)) {
		t.Fatalf("Backfill counted %d, returned %d and sent %d events, want %d", total, n, len(got), len(want))
	}
	for i, ev := range got {
		if ev.ID != want[i] || ev.Index != i || ev.Seq != uint64(i+1) || ev.CommitLSN != c.ConsistentPoint-1 || !ev.Backfill {
			t.Fatalf("event %d: id %q index %d seq %d lsn %s backfill %v; want id %q", i, ev.ID, ev.Index, ev.Seq, ev.CommitLSN, ev.Backfill, want[i])
		}
		var problem string
		switch {
		case strings.HasPrefix(ev.ID, "c-oversize"):
			problem = fmt.Sprintf("payload is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", 3*limit, limit)
		case strings.HasPrefix(ev.ID, "d-heavy"):
			problem = fmt.Sprintf("row is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", len(ev.ID)+1+700*kib+len(heavy), limit)
		case ev.ID == "e-null":
			problem = `column "payload" is NULL`
		}
		if ev.Problem != problem {
			t.Fatalf("event %s: problem %q, want %q", ev.ID, ev.Problem, problem)
		}
		if problem != "" && problem != `column "payload" is NULL` {
			if ev.Payload != nil || ev.Headers != nil || ev.RoutingKey != "" {
				t.Fatalf("oversize event %s came with its values: %d payload bytes, %d header bytes", ev.ID, len(ev.Payload), len(ev.Headers))
			}
			continue
		}
		wantPayload := map[bool]string{true: big, false: "small"}[strings.HasPrefix(ev.ID, "b-big")]
		if problem == "" && (string(ev.Payload) != wantPayload || ev.RoutingKey != "k" || ev.Headers != nil) {
			t.Fatalf("event %s: %d payload bytes, key %q, headers %q", ev.ID, len(ev.Payload), ev.RoutingKey, ev.Headers)
		}
	}

	// Without a limit (MaxMessageBytes 0) nothing is judged by size.
	m.MaxMessageBytes = 0
	out = make(chan wal.Event, 2000)
	if _, err := Backfill(ctx, db, c, m, &backfillTestSeq{}, out, nil); err != nil {
		t.Fatal(err)
	}
	for ev := range out {
		if strings.HasPrefix(ev.ID, "c-oversize") && (ev.Problem != "" || len(ev.Payload) != 3*limit) {
			t.Fatalf("without a limit, event %s: problem %q, %d payload bytes", ev.ID, ev.Problem, len(ev.Payload))
		}
		if strings.HasPrefix(ev.ID, "d-heavy") && (ev.Problem != "" || string(ev.Headers) != heavy) {
			t.Fatalf("without a limit, event %s: problem %q, %d header bytes", ev.ID, ev.Problem, len(ev.Headers))
		}
	}

	fetches := backfillTestFetches(pg.ServerLog())
	t.Logf("FETCH sizes: %v", fetches)
	if len(fetches) == 0 || fetches[0] != backfillFirstFetch {
		t.Fatalf("FETCH sizes %v: want the first to be %d", fetches, backfillFirstFetch)
	}
	if !slices.Contains(fetches, backfillBatch) {
		t.Fatalf("FETCH sizes %v: small rows never reached %d a FETCH", fetches, backfillBatch)
	}
	if slices.Max(fetches) > backfillBatch {
		t.Fatalf("FETCH sizes %v: above %d", fetches, backfillBatch)
	}
	// The first FETCH reads only small rows and the next grows fourfold;
	// it reads only 120 KiB rows, so the next asks for as many of them as
	// fit in backfillFetchBytes.
	if len(fetches) < 3 || fetches[1] != 4*backfillFirstFetch || fetches[2] != 32 {
		t.Fatalf("FETCH sizes %v: want %d, %d, then 32 rows of 120 KiB", fetches, backfillFirstFetch, 4*backfillFirstFetch)
	}
}

// backfillTestFetches returns the row counts of the backfill's FETCH
// statements in a server log with log_statement = all.
func backfillTestFetches(log string) []int {
	var out []int
	re := regexp.MustCompile(`(?m)(?:statement|execute [^:]*): FETCH (\d+) FROM cdcrelay_backfill`)
	for _, m := range re.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

func backfillTestConnect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
