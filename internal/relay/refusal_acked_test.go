package relay_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// This file: what the broker acknowledged before it closed the channel on a
// refused message is not published again (docs/messages.md, "When the
// broker refuses a message"; invariants 1, 10 and 11, docs/architecture.md).

// h52Rows, h52Refused: one transaction of h52Rows rows (eight routing
// keys) whose row h52Refused (1-based) names an exchange that does not
// exist: the broker closes the channel on it (404) and drops what follows
// on that channel.
const (
	h52Rows    = 1200
	h52Refused = 900
)

// TestIntegrationAckedBeforeRefusalNotRepublished is the review's h52: the
// events the broker took before a channel-closing refusal must reach the
// janitor and the resume place, so that the next sessions skip them
// instead of publishing them again. Duplicates may only be of events
// behind the refused one. On the old relay 20 to 612 of the 899 rows
// before the refused one were delivered again with one channel, 123 to 660
// with two (three runs each; 407 in the review): the confirm loops dropped
// acks they had already received once the close ended the session, and
// RabbitMQ never sends the acks it still owed when it closes a channel
// (publish's drainFor). With two channels the rows are spread over both
// lanes by routing key: the other lane's acks are handed over as the
// session ends (publish's handOver).
func TestIntegrationAckedBeforeRefusalNotRepublished(t *testing.T) {
	t.Parallel() // waits for retries: see main_test.go
	for _, channels := range []int{1, 2} {
		t.Run(fmt.Sprintf("channels-%d", channels), func(t *testing.T) { ackedBeforeRefusal(t, channels) })
	}
}

func ackedBeforeRefusal(t *testing.T, channels int) {
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox ADD COLUMN exchange text`); err != nil {
		t.Fatal(err)
	}
	// A window larger than the rows before the refused one: they can all
	// be in flight at once.
	r := e.startRelay(map[string]string{"UNROUTABLE": "park", "MAX_IN_FLIGHT": "1000", "PUBLISH_CHANNELS": strconv.Itoa(channels)})
	r.waitStreaming(t)

	ids, last := insertRefusedInTheMiddle(t, e.db)
	before, refused, after := ids[:h52Refused-1], ids[h52Refused-1], ids[h52Refused:]
	waitDeliveredIDs(t, e.consumer, append(append([]string(nil), before...), after...), 90*time.Second, nil)
	checkParked(t, e, map[string]string{refused: `unroutable: the row's exchange "h52.missing" does not exist`})
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	// The slot is past everything: the relay publishes nothing more. Give
	// the queue a moment to deliver what the broker already took.
	time.Sleep(time.Second)

	counts := map[string]int{}
	for _, d := range e.consumer.Deliveries() {
		if !d.Redelivered { // a redelivery is the broker's, to this consumer, not the relay's
			counts[d.MessageID]++
		}
	}
	dupBefore, mostBefore := duplicates(counts, before)
	dupAfter, mostAfter := duplicates(counts, after)
	restarts := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")
	resumed := gauge(t, r.reg, "cdcrelay_resumed_events_total")
	t.Logf("%d channel(s): %d rows before the refused one: %d delivered more than once (at most %d times); %d rows after it: %d more than once (at most %d); refused row delivered %d times; %v pipeline restarts, %v events skipped as done",
		channels, len(before), dupBefore, mostBefore, len(after), dupAfter, mostAfter, counts[refused], restarts, resumed)
	if counts[refused] != 0 {
		t.Fatalf("the refused row was delivered %d times", counts[refused])
	}
	if restarts == 0 {
		t.Fatal("no pipeline restart: the broker never closed the channel, the run did not test the refusal")
	}
	if dupBefore != 0 {
		t.Fatalf("%d of the %d rows before the refused one were published again", dupBefore, len(before))
	}
	// messages.md: duplicates only of events behind the refused one, each
	// at most once more.
	if mostAfter > 2 {
		t.Fatalf("a row after the refused one was delivered %d times", mostAfter)
	}
}

// insertRefusedInTheMiddle inserts the h52 transaction and returns the ids
// in transaction order and the WAL insert position read inside it.
func insertRefusedInTheMiddle(t *testing.T, db *pgx.Conn) ([]string, pglogrepl.LSN) {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, h52Rows)
	var last pglogrepl.LSN
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			INSERT INTO event_outbox (routing_key, payload, exchange)
			SELECT 'ok.h52.' || g % 8, jsonb_build_object('n', g, 'event_type', 'TestEvent'),
			       CASE WHEN g = $2 THEN 'h52.missing' END
			FROM generate_series(1, $1) g ORDER BY g
			RETURNING id::text, (payload->>'n')::int`, h52Rows, h52Refused)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		type inserted struct {
			ID string
			N  int
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[inserted])
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if len(got) != h52Rows {
			return fmt.Errorf("inserted %d rows, want %d", len(got), h52Rows)
		}
		for _, r := range got {
			ids[r.N-1] = r.ID
		}
		return tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&last)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids, last
}

// duplicates counts the ids delivered more than once and the most
// deliveries of one id.
func duplicates(counts map[string]int, ids []string) (dups, most int) {
	for _, id := range ids {
		if counts[id] > 1 {
			dups++
		}
		most = max(most, counts[id])
	}
	return dups, most
}
