package preflight_test

import (
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationCheckRetentionIndex: `cdcrelay check` says whether retention and
// the backlog's age have what they need: the migrated schema passes, a
// dropped retention index or a table without enqueued_at is a warning.
func TestIntegrationCheckRetentionIndex(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	fs, _ := newFixture(t, pg, amqpURL).check(nil)
	has(t, fs, "retention", preflight.OK, "retention reads only the expired rows")
	has(t, fs, "marks", preflight.OK, "marks are full updates (an index entry each) because event_outbox_published_idx, event_outbox_unpublished_idx names published_at")

	fs, _ = newFixture(t, pg, amqpURL, `DROP INDEX event_outbox_published_idx`).check(nil)
	want(t, fs)
	has(t, fs, "retention", preflight.Warn, "remedy:CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_published_idx")

	fs, _ = newFixture(t, pg, amqpURL, `ALTER TABLE event_outbox DROP COLUMN enqueued_at`).check(nil)
	want(t, fs)
	has(t, fs, "retention", preflight.Warn, "cdcrelay_oldest_unpublished_age_seconds is NaN")

	// The HOT layout, as migrations/optional/hot_marks.sql leaves it.
	fs, _ = newFixture(t, pg, amqpURL, `ALTER TABLE event_outbox SET (fillfactor = 50)`,
		`CREATE INDEX event_outbox_enqueued_idx ON event_outbox (enqueued_at)`,
		`DROP INDEX event_outbox_published_idx`, `DROP INDEX event_outbox_unpublished_idx`).check(nil)
	want(t, fs)
	has(t, fs, "retention", preflight.OK, "retention reads only the expired rows")
	has(t, fs, "marks", preflight.OK, "no index names published_at (the HOT layout), fillfactor 50")

	fs, _ = newFixture(t, pg, amqpURL, `DROP INDEX event_outbox_published_idx`, `DROP INDEX event_outbox_unpublished_idx`).check(nil)
	has(t, fs, "marks", preflight.Warn, "remedy:CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_enqueued_idx")
}
