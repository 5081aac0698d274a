package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationAdoptionBoundedByBytes adopts a backlog of 300 rows of
// 1 MiB with a 2 MiB byte budget: the backfill hands rows on one at a time
// as they arrive, so the relay holds about the budget plus a row or two,
// never a whole FETCH of them (500 rows, 300 MiB here). Its peak RSS
// (VmHWM) stays under 64 MiB; every row is delivered and marked.
func TestIntegrationAdoptionBoundedByBytes(t *testing.T) {
	const peakLimit = 64 << 10 // KiB
	e := newEnv(t, testenv.PostgresOptions{}, "mem.#")
	ids := memoryBudgetInsert(t, e, 300, 1<<20)
	began := time.Now()
	p := memoryBudgetProcess(t, e, map[string]string{"MAX_IN_FLIGHT_BYTES": "2MiB", "LOG_LEVEL": "info"})
	waitDeliveredIDs(t, e.consumer, ids, 3*time.Minute, nil)
	rows := make([]row, len(ids))
	for i, id := range ids {
		rows[i].id = id
	}
	waitMarked(t, e, rows, time.Minute)
	took := time.Since(began)
	_, peak := memoryBudgetRSS(t, p.Cmd.Process.Pid)
	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	t.Logf("adopted %d rows of 1 MiB with a 2 MiB budget in %s: peak RSS %d MiB", len(ids), took.Round(100*time.Millisecond), peak>>10)
	if peak > peakLimit {
		t.Fatalf("peak RSS %d MiB adopting 1 MiB rows with a 2 MiB budget, above %d MiB: the backfill is not bounded by bytes", peak>>10, peakLimit>>10)
	}
}

// TestIntegrationAdoptionOversizeRowNotFetched: a 64 MiB row in the
// backlog, four times CDCRELAY_MAX_MESSAGE_BYTES, is parked with a Problem
// naming its size, judged from its length in the database: its payload is
// never fetched, so the relay's peak RSS stays under the row's size.
// The rows around it are published.
func TestIntegrationAdoptionOversizeRowNotFetched(t *testing.T) {
	const (
		mib       = 1 << 20
		big       = 64 * mib
		peakLimit = 48 << 10 // KiB: below the row's size
	)
	e := newEnv(t, testenv.PostgresOptions{}, "mem.#")
	ctx := context.Background()
	small := memoryBudgetInsert(t, e, 5, 1024)
	var bigID string
	if err := e.db.QueryRow(ctx, `
		INSERT INTO event_outbox (routing_key, payload)
		SELECT 'mem.big', jsonb_build_object('event_type', 'TestEvent', 'pad', string_agg(md5(g::text), '')) FROM generate_series(1, $1 / 32) g
		RETURNING id::text`, big).Scan(&bigID); err != nil {
		t.Fatal(err)
	}
	small = append(small, memoryBudgetInsert(t, e, 5, 1024)...)
	p := memoryBudgetProcess(t, e, map[string]string{"MAX_MESSAGE_BYTES": "16MiB", "LOG_LEVEL": "info"})
	waitDeliveredIDs(t, e.consumer, small, 3*time.Minute, nil)
	var lastError string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var attempts int
		var le *string
		if err := e.db.QueryRow(ctx, `SELECT attempts, last_error FROM event_outbox WHERE id = $1::uuid`, bigID).Scan(&attempts, &le); err != nil {
			t.Fatal(err)
		}
		if attempts == 1 && le != nil {
			lastError = *le
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the oversize row was not parked")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, peak := memoryBudgetRSS(t, p.Cmd.Process.Pid)
	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	t.Logf("a %d MiB backlog row parked (%q): peak RSS %d MiB", big/mib, lastError, peak>>10)
	if !strings.Contains(lastError, "above CDCRELAY_MAX_MESSAGE_BYTES") {
		t.Fatalf("parked with %q, want the size named", lastError)
	}
	for _, d := range e.consumer.Deliveries() {
		if d.MessageID == bigID {
			t.Fatal("the oversize row was published")
		}
	}
	if peak > peakLimit {
		t.Fatalf("peak RSS %d MiB after parking a %d MiB backlog row, above %d MiB: the row was fetched whole", peak>>10, big/mib, peakLimit>>10)
	}
}
