package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationGeneratedRoutingKeyRefusedAtStart: with the routing key
// GENERATED ALWAYS AS (…) STORED, pgoutput (PostgreSQL before 18) sends
// rows without it. The relay refuses at start, fatally and with the
// remedy, before it creates the slot, so a backlog waiting in the table
// is not published (the review saw 3 rows published, then a stop at the
// first streamed row).
func TestIntegrationGeneratedRoutingKeyRefusedAtStart(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `
		ALTER TABLE event_outbox DROP COLUMN routing_key;
		ALTER TABLE event_outbox ADD COLUMN routing_key text GENERATED ALWAYS AS (payload->>'kind') STORED;
		INSERT INTO event_outbox (payload) SELECT jsonb_build_object('kind', 'generated.k', 'n', n) FROM generate_series(1, 3) n`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	err := r.Wait(t, 30*time.Second, "the relay to refuse the generated routing key")
	if !errors.Is(err, slot.ErrPublication) || !relay.IsFatal(err) ||
		!strings.Contains(err.Error(), `column "routing_key" of "public"."event_outbox" is GENERATED ALWAYS AS (…) STORED`) ||
		!strings.Contains(err.Error(), "BEFORE INSERT trigger") {
		t.Fatalf("relay ended with %v; want a fatal ErrPublication naming routing_key and the remedy", err)
	}
	// The relay has ended: a late delivery would be in the queue before
	// the barrier.
	if n := len(e.brokerBarrier(t, "generated.k")); n != 0 {
		t.Fatalf("%d messages published before the refusal, want 0", n)
	}
	var slots int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatalf("%d replication slots: the relay created one before refusing", slots)
	}
}
