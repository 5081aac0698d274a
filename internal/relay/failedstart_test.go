package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// The tests of a start that fails: it leaves no slot behind, and says why
// with check's remedy; a slot that existed before the start is kept.

// replicationSlots lists every replication slot of the cluster.
func replicationSlots(t *testing.T, e *env) []string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT slot_name::text FROM pg_replication_slots ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestIntegrationNoPublishedAtRefusedBeforeSlot: a table without
// published_at (the review's case: run created the slot and its marker,
// then exited on the backlog query without a remedy, and both slots kept
// WAL) makes run exit fatally before it creates anything, with check's
// own finding and remedy.
func TestIntegrationNoPublishedAtRefusedBeforeSlot(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox DROP COLUMN published_at;
		INSERT INTO event_outbox (routing_key, payload) VALUES ('k', '{"event_type": "TestEvent"}')`); err != nil {
		t.Fatal(err)
	}
	var want preflight.Finding
	for _, f := range preflight.Run(ctx, e.config(nil), preflight.Options{}) {
		if f.Severity == preflight.Error && strings.Contains(f.Message, "has no published_at column") {
			want = f
		}
	}
	if want.Remedy == "" || !strings.Contains(want.Remedy, "ADD COLUMN published_at timestamptz;") {
		t.Fatalf("check reported no error with a remedy for the missing published_at: %+v", want)
	}
	r := e.startRelay(nil)
	err := r.Wait(t, 30*time.Second, "the relay to refuse the table without published_at")
	if !relay.IsFatal(err) || !errors.Is(err, wal.ErrSchema) ||
		!strings.Contains(err.Error(), want.Message) || !strings.Contains(err.Error(), want.Remedy) {
		t.Fatalf("relay ended with %v; want a fatal error with check's finding %q and remedy %q", err, want.Message, want.Remedy)
	}
	if slots := replicationSlots(t, e); len(slots) != 0 {
		t.Fatalf("replication slots %v after the refused start, want none", slots)
	}
	if strings.Contains(r.logs.String(), "created replication slot") {
		t.Fatal("the relay created a slot before refusing the table")
	}
}

// TestIntegrationFailedStartDropsItsSlot: a fatal error after the slot was
// created (a poison row in the backlog with CDCRELAY_POISON=stop) drops
// the slot and its adoption marker again, and the error says so.
func TestIntegrationFailedStartDropsItsSlot(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('k', jsonb_build_object('event_type', 'TestEvent', 'pad', repeat('x', 4096)))`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"POISON": "stop", "MAX_MESSAGE_BYTES": "1KiB"})
	err := r.Wait(t, 30*time.Second, "the relay to stop at the poison row of its backlog")
	if !relay.IsFatal(err) || !errors.Is(err, publish.ErrPoison) {
		t.Fatalf("relay ended with %v; want a fatal poison error", err)
	}
	if !strings.Contains(r.logs.String(), "created replication slot") {
		t.Fatal("the relay failed before it created the slot: this test needs a failure after it")
	}
	if slots := replicationSlots(t, e); len(slots) != 0 {
		t.Fatalf("replication slots %v after the failed start, want none: they keep WAL for good", slots)
	}
	if !strings.Contains(err.Error(), "cdcrelay_outbox and its adoption marker cdcrelay_outbox_adopting, which this start created, were dropped") {
		t.Fatalf("the error does not say the slots were dropped: %v", err)
	}
}

// TestIntegrationFatalKeepsExistingSlot: the relay's slot existed before
// this start (a restart of a relay that streamed): a fatal error keeps
// it, since it holds the position of events not yet confirmed.
func TestIntegrationFatalKeepsExistingSlot(t *testing.T) {
	e, r := streamingRelay(t, nil)
	insertMarked(t, e, 3, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	before := testenv.ConfirmedFlush(t, e.db, slotName)
	if _, err := e.db.Exec(context.Background(), `INSERT INTO event_outbox (routing_key, payload) VALUES ('k', jsonb_build_object('event_type', 'TestEvent', 'pad', repeat('x', 4096)))`); err != nil {
		t.Fatal(err)
	}
	r = e.startRelay(map[string]string{"POISON": "stop", "MAX_MESSAGE_BYTES": "1KiB"})
	err := r.Wait(t, 30*time.Second, "the relay to stop at the poison row")
	if !relay.IsFatal(err) || !errors.Is(err, publish.ErrPoison) {
		t.Fatalf("relay ended with %v; want a fatal poison error", err)
	}
	if slots := replicationSlots(t, e); len(slots) != 1 || slots[0] != slotName {
		t.Fatalf("replication slots %v after the fatal exit, want the existing %s kept", slots, slotName)
	}
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got < before {
		t.Fatalf("slot went back from %s to %s", before, got)
	}
	if strings.Contains(err.Error(), "were dropped") {
		t.Fatalf("the error claims a drop: %v", err)
	}
}
