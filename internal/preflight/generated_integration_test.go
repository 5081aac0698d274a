package preflight_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationGeneratedMappedColumn: a routing key column GENERATED
// ALWAYS AS (…) STORED is left out of every row pgoutput sends before
// PostgreSQL 18. check refuses it with the reason and the remedy, and so
// does the publication check every session start runs (slot.VerifyPublication),
// before anything is published; a generated column the relay does not map
// is harmless and refused by neither.
func TestIntegrationGeneratedMappedColumn(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1GB"}})
	f := newFixture(t, pg, amqpURL,
		`ALTER TABLE event_outbox DROP COLUMN routing_key`,
		`ALTER TABLE event_outbox ADD COLUMN routing_key text GENERATED ALWAYS AS (payload->>'kind') STORED`,
		`ALTER TABLE event_outbox ADD COLUMN kind_upper text GENERATED ALWAYS AS (upper(payload->>'kind')) STORED`,
	)
	fs, _ := f.check(nil)
	want(t, fs, [2]string{"mapping", `column "routing_key" of "public"."event_outbox" is GENERATED ALWAYS AS (…) STORED: PostgreSQL before 18 does not publish generated columns`})
	has(t, fs, "mapping", preflight.Error, "remedy:make it a plain column filled by the application or a BEFORE INSERT trigger")

	ctx := context.Background()
	target := config.Outbox{Publication: "cdcrelay_outbox", Schema: "public", Table: "event_outbox"}
	_, _, err := slot.VerifyPublication(ctx, f.admin, target, "id", "routing_key", "payload", "headers", "", "")
	if !errors.Is(err, slot.ErrPublication) || !strings.Contains(err.Error(), `"routing_key"`) || !strings.Contains(err.Error(), "BEFORE INSERT trigger") {
		t.Fatalf("start check: %v; want ErrPublication naming routing_key and the remedy", err)
	}
	if _, _, err := slot.VerifyPublication(ctx, f.admin, target, "id", "payload", "kind_upper_is_not_mapped"); err != nil {
		t.Fatalf("an unmapped generated column refused at start: %v", err)
	}
}
