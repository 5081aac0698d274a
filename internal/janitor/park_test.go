package janitor

import (
	"context"
	"testing"
)

// TestIntegrationParkUnseen: a park whose UPDATE finds no row settles as a
// mark does (splitMarked). While the row's transaction runs, the park
// stays queued and its done waits; once the transaction commits, the next
// flush records it. A row that never appears (deleted) is found gone at
// the second flush after its transaction is visible, and only then.
func TestIntegrationParkUnseen(t *testing.T) {
	ctx := context.Background()
	j, db := markJanitor(t, `CREATE TABLE event_outbox (id text PRIMARY KEY, published_at timestamptz, attempts int NOT NULL DEFAULT 0, last_error text)`)
	open, xid := openInsert(t, db, "late")
	settled := map[string]int{}
	for _, p := range []struct {
		id  string
		xid uint32
	}{{"late", xid}, {"deleted", 0}} {
		if err := j.park(ctx, p.id, p.xid, "bad json", func() { settled[p.id]++ }); err != nil {
			t.Fatal(err)
		}
	}
	flush := func(want map[string]int, queued int) {
		t.Helper()
		if err := j.flushParked(ctx); err != nil {
			t.Fatal(err)
		}
		if len(settled) != len(want) || settled["late"] != want["late"] || settled["deleted"] != want["deleted"] || len(j.parked) != queued {
			t.Fatalf("settled %v, %d queued; want %v, %d queued", settled, len(j.parked), want, queued)
		}
	}
	flush(map[string]int{}, 2)             // late: still running; deleted: visible now, one more try
	flush(map[string]int{"deleted": 1}, 1) // deleted: gone; late: still running
	flush(map[string]int{"deleted": 1}, 1) // late waits however many flushes it takes
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	flush(map[string]int{"deleted": 1, "late": 1}, 0)
	var attempts int
	var lastError string
	if err := db.QueryRow(ctx, `SELECT attempts, last_error FROM event_outbox WHERE id = 'late'`).Scan(&attempts, &lastError); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || lastError != "bad json" {
		t.Fatalf("late row: attempts %d, last_error %q; want 1, %q", attempts, lastError, "bad json")
	}
}
