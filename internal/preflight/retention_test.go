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
