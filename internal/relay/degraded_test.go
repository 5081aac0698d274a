//go:build faults

package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMarksFailingDegraded: a role that may not mark rows (no
// UPDATE grant) still streams and stays ready, but its status says
// "degraded" within half a minute with the grant to give, and
// cdcrelay_marks_failing_seconds counts; once granted, the rows are marked
// and both clear.
func TestIntegrationMarksFailingDegraded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `REVOKE UPDATE ON event_outbox FROM cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "orders.created", 3)
	testenv.WaitCount(t, e.consumer, len(rows), time.Minute)
	r.WaitFor(t, time.Minute, "a degraded status naming the grant", func() bool {
		s := r.relay.Status()
		return strings.HasPrefix(s, "streaming: degraded: marks failing for ") && strings.Contains(s, "GRANT UPDATE (published_at, attempts, last_error)")
	})
	t.Logf("status: %s", r.relay.Status())
	if v := gauge(t, r.reg, "cdcrelay_marks_failing_seconds"); v < 20 {
		t.Errorf("cdcrelay_marks_failing_seconds %v while degraded", v)
	}
	if got := statusReason(t, r.reg); got != "marks_failing" {
		t.Errorf("cdcrelay_status says %q while degraded, want marks_failing", got)
	}
	if _, err := e.db.Exec(ctx, `GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	waitMarked(t, e, rows, 30*time.Second)
	r.WaitFor(t, 10*time.Second, "the status to clear", func() bool { return r.relay.Status() == "streaming" })
	if v := gauge(t, r.reg, "cdcrelay_marks_failing_seconds"); v != 0 {
		t.Errorf("cdcrelay_marks_failing_seconds %v after the marks succeeded", v)
	}
	if got := statusReason(t, r.reg); got != "ok" {
		t.Errorf("cdcrelay_status says %q after the marks succeeded, want ok", got)
	}
}
