package migrations

import (
	"regexp"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestRenderLeavesNoDefault holds every file to the conventions Render
// relies on: rendered for other names, no default name is left over.
func TestRenderLeavesNoDefault(t *testing.T) {
	leftover := regexp.MustCompile(`event_outbox|cdcrelay_outbox|\$\$`)
	target := config.Outbox{Schema: "Billing", Table: "Outbox Events", Publication: "Billing Pub"}
	for _, name := range append(Names(), HOTFile) {
		sql, err := Render(name, target)
		if err != nil {
			t.Fatal(err)
		}
		if m := leftover.FindString(sql); m != "" {
			t.Errorf("%s rendered for %+v still says %q:\n%s", name, target, m, sql)
		}
		if !strings.Contains(sql, `"Billing"."Outbox Events"`) {
			t.Errorf("%s does not name the table:\n%s", name, sql)
		}
	}
}

func TestRender(t *testing.T) {
	sql, err := Render("0001_event_outbox.sql", config.Outbox{Schema: "orders", Table: "event_outbox", Publication: "cdcrelay_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "orders"."event_outbox" (`,
		`WHERE relname IN ('event_outbox_unpublished_idx', 'event_outbox_enqueued_idx')`,
		`oid = '"orders"."event_outbox"'::regclass`,
		`CREATE INDEX "event_outbox_unpublished_idx"` + "\n" + `            ON "orders"."event_outbox" (enqueued_at)`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("missing %q in:\n%s", want, sql)
		}
	}
	sql, err = Render("0002_publication.sql", config.Outbox{Schema: "a$$b", Table: `it's "x"`, Publication: "My Pub"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`WHERE pubname = 'My Pub'`,
		`oid = '"a$$b"."it''s ""x"""'::regclass`,
		`CREATE PUBLICATION "My Pub" FOR TABLE "a$$b"."it's ""x""" WITH (publish = 'insert', publish_via_partition_root = true)`,
		"DO $cdcrelay$", "END\n$cdcrelay$;",
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("missing %q in:\n%s", want, sql)
		}
	}
}

// TestHOTStatements: the HOT file splits into its five statements, each
// rendered for the target, and 0003 carries the directive that skips it on
// that layout.
func TestHOTStatements(t *testing.T) {
	sql, err := Render(HOTFile, config.Outbox{Schema: "orders", Table: "outbox", Publication: "p"})
	if err != nil {
		t.Fatal(err)
	}
	got := Statements(sql)
	want := []string{
		`ALTER TABLE "orders"."outbox" SET (fillfactor = 50);`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_enqueued_idx" ON "orders"."outbox" (enqueued_at);`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_parked_idx" ON "orders"."outbox" (enqueued_at) WHERE last_error IS NOT NULL;`,
		`DROP INDEX CONCURRENTLY IF EXISTS "outbox_unpublished_idx";`,
		`DROP INDEX CONCURRENTLY IF EXISTS "outbox_published_idx";`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("statements:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	sql, err = Render("0003_retention_index.sql", config.Outbox{Schema: "orders", Table: "it's", Publication: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if m := unlessIndex.FindStringSubmatch(sql); m == nil || m[1] != "it''s_enqueued_idx" {
		t.Fatalf("0003's directive: %q in\n%s", m, sql)
	}
}
