package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMigrateHOTMarks: `cdcrelay migrate -hot-marks` puts the
// outbox on the HOT layout; a plain `migrate` after it keeps the layout
// (it does not build the partial indexes again); a partitioned outbox is
// refused with what to do instead; a stray argument is refused.
func TestIntegrationMigrateHOTMarks(t *testing.T) {
	ctx := context.Background()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	db, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(ctx) }()
	t.Setenv("CDCRELAY_DATABASE_URL", pg.URL("postgres"))
	var stderr bytes.Buffer
	for _, args := range [][]string{{"-hot-marks"}, {}, {"-hot-marks"}} {
		if err := migrate(ctx, args, &stderr); err != nil {
			t.Fatalf("migrate %v: %v\n%s", args, err, stderr.String())
		}
	}
	rows, err := db.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'event_outbox'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"event_outbox_enqueued_idx", "event_outbox_parked_idx", "event_outbox_pkey"}; !slices.Equal(indexes, want) {
		t.Fatalf("indexes after migrate -hot-marks, migrate, migrate -hot-marks: %v, want %v", indexes, want)
	}
	var options []string
	if err := db.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'event_outbox'::regclass`).Scan(&options); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(options, "fillfactor=50") {
		t.Fatalf("reloptions %v, want fillfactor=50", options)
	}
	if !strings.Contains(stderr.String(), "optional/hot_marks.sql") {
		t.Errorf("the log does not name the HOT file:\n%s", stderr.String())
	}

	// In a schema off the search_path, with an index of the service's own
	// that names published_at: the layout's indexes are right, and that
	// index is named as what keeps marks from being heap-only.
	if _, err := db.Exec(ctx, `CREATE SCHEMA billing`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CDCRELAY_TABLE", "billing.outbox")
	t.Setenv("CDCRELAY_PUBLICATION", "billing_pub")
	if err := migrate(ctx, nil, &stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE INDEX mine ON billing.outbox (published_at)`); err != nil {
		t.Fatal(err)
	}
	err = migrate(ctx, []string{"-hot-marks"}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "cannot be heap-only while an index names published_at") || !strings.Contains(err.Error(), "CREATE INDEX mine ON billing.outbox USING btree (published_at)") {
		t.Fatalf("migrate -hot-marks with an index on published_at: %v, want it named", err)
	}
	rows, err = db.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'billing.outbox'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"billing.mine", "billing.outbox_enqueued_idx", "billing.outbox_parked_idx", "billing.outbox_pkey"}; !slices.Equal(indexes, want) {
		t.Fatalf("indexes of billing.outbox: %v, want %v", indexes, want)
	}

	t.Setenv("CDCRELAY_TABLE", "public.parted")
	t.Setenv("CDCRELAY_PUBLICATION", "parted_pub")
	if _, err := db.Exec(ctx, `CREATE TABLE parted (LIKE event_outbox INCLUDING DEFAULTS, PRIMARY KEY (id, enqueued_at)) PARTITION BY RANGE (enqueued_at)`); err != nil {
		t.Fatal(err)
	}
	err = migrate(ctx, []string{"-hot-marks"}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "is partitioned: set fillfactor and build the indexes") {
		t.Fatalf("migrate -hot-marks on a partitioned outbox: %v, want the refusal", err)
	}
	if err := migrate(ctx, []string{"-hot-marks", "now"}, &stderr); err == nil || !strings.Contains(err.Error(), "takes no arguments") {
		t.Fatalf("migrate -hot-marks now: %v, want a refusal", err)
	}
}
