package preflight

import (
	"strings"
	"testing"
)

// TestClassifyRetention: the enqueued_at column and the retention index
// each missing is a warning with the statement that fixes it.
func TestClassifyRetention(t *testing.T) {
	noEnqueued := outboxColumns()
	noEnqueued.columns = noEnqueued.columns[:3]
	noEnqueued.columns = append(noEnqueued.columns, column{"published_at", "timestamp with time zone", "timestamptz", false})
	for _, c := range []struct {
		name            string
		tf              tableFacts
		indexed         bool
		sev             Severity
		message, remedy string
	}{
		{"good", outboxColumns(), true, OK, "retention reads only the expired rows", ""},
		{"no index", outboxColumns(), false, Warn, "no index on (enqueued_at)",
			`CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_published_idx ON public.event_outbox (enqueued_at) WHERE published_at IS NOT NULL;`},
		{"no enqueued_at", noEnqueued, false, Warn, "cdcrelay_oldest_unpublished_age_seconds is NaN",
			"ALTER TABLE public.event_outbox ADD COLUMN enqueued_at timestamptz NOT NULL DEFAULT now();"},
	} {
		f := classifyRetention(tgt, c.tf, c.indexed)
		if f.Check != checkRetention || f.Severity != c.sev || !strings.Contains(f.Message, c.message) || !strings.Contains(f.Remedy, c.remedy) {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}

// TestClassifyMarks: the default layout and the HOT layout are each sound
// and named; a table the monitor can only read in full is a warning.
func TestClassifyMarks(t *testing.T) {
	for _, c := range []struct {
		name            string
		f               markFacts
		sev             Severity
		message, remedy string
	}{
		{"default", markFacts{blockers: []string{"event_outbox_published_idx", "event_outbox_unpublished_idx"}, unpublished: true, fillfactor: 100}, OK,
			"marks are full updates (an index entry each) because event_outbox_published_idx, event_outbox_unpublished_idx names published_at", ""},
		{"hot", markFacts{enqueued: true, fillfactor: 50}, OK, "marks can be heap-only updates: no index names published_at (the HOT layout), fillfactor 50", ""},
		{"hot, full pages", markFacts{enqueued: true, fillfactor: 100}, OK, "SET (fillfactor = 50)", ""},
		{"no index", markFacts{fillfactor: 100}, Warn, "the monitor reads the whole table on every refresh",
			"CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_enqueued_idx ON public.event_outbox (enqueued_at);"},
	} {
		f := classifyMarks(tgt, c.f)
		if f.Check != checkMarks || f.Severity != c.sev || !strings.Contains(f.Message, c.message) || !strings.Contains(f.Remedy, c.remedy) {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}
