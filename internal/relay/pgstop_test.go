package relay_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Tests of a primary's fast shutdown while marks wait. A logical walsender
// exits only once the client has confirmed all the WAL sent to it, and the
// relay withholds that confirmation while acked rows are unmarked
// (invariant 10, docs/architecture.md): the relay must end its session when
// the janitor learns that the database is shutting down.

// pgstopBound is the generous liveness bound for a fast stop; with the
// relay holding the walsender the stop never completes.
const pgstopBound = 20 * time.Second

// pgstopDeliverUnmarked inserts rows until some are delivered and still
// unmarked just before the caller acts (the janitor's tick may land in
// between); it returns every row inserted.
func pgstopDeliverUnmarked(t *testing.T, e *env) []row {
	t.Helper()
	var all []row
	for range 5 {
		rows, _ := insertTxns(t, e.db, "k", 100, 100)
		all = append(all, rows...)
		waitAll(t, e.consumer, rows, 30*time.Second)
		if n := unmarked(t, e, rows); n > 0 {
			t.Logf("%d of %d delivered rows unmarked before the stop", n, len(rows))
			return all
		}
	}
	t.Fatal("every delivered row was marked at once; the mark interval did not hold them")
	return nil
}

// pgstopFast stops PostgreSQL with -m fast, failing (not hanging) if it
// does not complete within pgstopBound, and checks that the relay ended
// its session for that reason and keeps running.
func pgstopFast(t *testing.T, e *env, r *running) time.Duration {
	t.Helper()
	took := pgstopFastWithin(t, e, "the relay holds the walsender")
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay stopped: %v", err)
	}
	// Two signals end the session; whichever comes first: the janitor's
	// (57P03 after its connection was terminated) and the slot lock's fence
	// (a fast stop terminates the lock's connection too).
	logs := r.logs.String()
	janitor := strings.Contains(logs, "database is shutting down; ending the replication session")
	fence := strings.Contains(logs, "lost the slot lock")
	if !janitor && !fence {
		t.Fatal("the relay did not log why it ended the session")
	}
	t.Logf("session ended by: janitor %v, slot lock fence %v", janitor, fence)
	return took
}

// pgstopFastWithin stops PostgreSQL with -m fast and returns how long it
// took, failing (not hanging) if it does not complete within pgstopBound;
// why names the likely cause in that failure.
func pgstopFastWithin(t *testing.T, e *env, why string) time.Duration {
	t.Helper()
	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- e.pg.Stop(context.Background(), "fast") }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(pgstopBound):
		t.Fatalf("pg_ctl stop -m fast still waiting after %s: %s", pgstopBound, why)
	}
	return time.Since(began)
}

// TestIntegrationPgstopFastStopWithUnmarkedRows: a fast stop of PostgreSQL
// while delivered rows wait to be marked (MARK_INTERVAL=5s) completes
// within seconds: the janitor sees the shutdown (57P01, then 57P03) and
// the relay ends its session, so the walsender can exit. After the restart
// every row is delivered and marked, and the slot passes them.
func TestIntegrationPgstopFastStopWithUnmarkedRows(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "5s", "MARK_BATCH": "100000"})
	// A first batch marked: the janitor's connection is open at the stop
	// and is terminated (57P01) rather than refused later (57P03).
	warm := insertMarked(t, e, 10, 15*time.Second)
	rows := slices.Concat(warm, pgstopDeliverUnmarked(t, e))

	took := pgstopFast(t, e, r)
	t.Logf("fast stop took %s with marks waiting", took.Round(time.Millisecond))

	restartPostgres(t, e)
	after, last := insertTxns(t, e.db, "k", 10)
	all := slices.Concat(rows, after)
	waitAll(t, e.consumer, all, 60*time.Second)
	markedIn := waitMarked(t, e, all, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 30*time.Second)
	dups := report(t, all, e.consumer.Deliveries())
	t.Logf("after the restart: %d rows delivered (%d duplicates), all marked %s later, slot past them",
		len(all), dups, markedIn.Round(time.Millisecond))
}

// TestIntegrationPgstopRevokeKeepsSession: a janitor refused by the
// permission system (REVOKE UPDATE) is not a shutdown: the session goes
// on delivering, no restart, and marks resume after the GRANT.
func TestIntegrationPgstopRevokeKeepsSession(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms"})
	marksExec(t, e, marksRevokeSQL)
	blocked, _ := insertDelivered(t, e, 10, 10)
	waitCounter(t, r.reg, "cdcrelay_janitor_errors_total", 3, 30*time.Second) // several failed mark attempts (backoff capped at 1s)
	if errs := gauge(t, r.reg, "cdcrelay_janitor_errors_total"); errs < 2 {
		t.Fatalf("%v janitor errors while revoked; the test did not exercise refused marks", errs)
	}
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts while marks were refused by a permission error", n)
	}
	if strings.Contains(r.logs.String(), "database is shutting down") {
		t.Fatal("a permission error was taken for a shutdown")
	}
	more, last := insertDelivered(t, e, 10) // delivery goes on
	marksExec(t, e, marksGrantSQL)
	waitMarked(t, e, append(blocked, more...), 15*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 15*time.Second)
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v pipeline restarts", n)
	}
	t.Logf("%v refused mark attempts, 0 restarts; all %d rows marked after the grant", gauge(t, r.reg, "cdcrelay_janitor_errors_total"), len(blocked)+len(more))
}

// TestIntegrationPgstopFastStopWhileMarksRefused: marking is refused
// (REVOKE UPDATE) when the primary is stopped fast; the janitor, failing
// on its backoff schedule, still learns of the shutdown and the stop
// completes. After the restart the rows stay unmarked and the slot before
// them until the GRANT; then every row ends marked.
func TestIntegrationPgstopFastStopWhileMarksRefused(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	warm := insertMarked(t, e, 5, 10*time.Second)
	marksExec(t, e, marksRevokeSQL)
	rows, _ := insertDelivered(t, e, 20, 20)
	// Marks refused on the backoff schedule: two attempts at these rows.
	waitCounter(t, r.reg, "cdcrelay_janitor_errors_total", gauge(t, r.reg, "cdcrelay_janitor_errors_total")+2, 30*time.Second)
	if n := unmarked(t, e, rows); n != len(rows) {
		t.Fatalf("%d rows marked without the grant", len(rows)-n)
	}
	took := pgstopFast(t, e, r)
	t.Logf("fast stop took %s while marks were refused", took.Round(time.Millisecond))

	restartPostgres(t, e)
	first := marksCommitLSN(t, e, rows[0].id)
	after, last := insertTxns(t, e.db, "k", 10)
	all := slices.Concat(rows, after)
	waitAll(t, e.consumer, all, 60*time.Second)
	liveFor(t, r, 2*time.Second) // status updates sent meanwhile, none past the unmarked rows
	if got := testenv.ConfirmedFlush(t, e.db, marksSlot); got > first {
		t.Fatalf("slot confirmed %s after the restart, past the commit %s of unmarked rows", got, first)
	}
	marksExec(t, e, marksGrantSQL)
	markedIn := waitMarked(t, e, all, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 30*time.Second)
	dups := report(t, append(warm, all...), e.consumer.Deliveries())
	t.Logf("after the restart and the grant: %d rows delivered (%d duplicates), all marked %s after the grant, slot past them",
		len(warm)+len(all), dups, markedIn.Round(time.Millisecond))
}

// TestIntegrationPgstopTerminatedBackendsKeepSession: pg_terminate_backend
// of the relay's normal connections (janitor, monitor, retention) sends
// the same 57P01 as a fast shutdown, but the server stays up: the janitor
// connects again, marks, and the session goes on without a restart.
func TestIntegrationPgstopTerminatedBackendsKeepSession(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms"})
	insertMarked(t, e, 5, 10*time.Second) // the janitor's connection is open
	var ended int
	err := e.db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE usename = 'cdcrelay_app' AND backend_type = 'client backend' AND datname = current_database()`).Scan(&ended)
	if err != nil || ended == 0 {
		t.Fatalf("terminated %d of the relay's backends: %v", ended, err)
	}
	rows, last := insertDelivered(t, e, 20)
	markedIn := waitMarked(t, e, rows, 15*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 15*time.Second)
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 || strings.Contains(r.logs.String(), "database is shutting down") {
		t.Fatalf("%v pipeline restarts after terminating the relay's normal backends", n)
	}
	t.Logf("%d backends terminated; the next %d rows marked %s after delivery, no restart", ended, len(rows), markedIn.Round(time.Millisecond))
}

// TestIntegrationPgstopFastStopNothingToMark: with every delivered row
// marked, the relay confirms all it was sent and the walsender exits by
// itself at a fast stop; the session is not ended by the janitor.
func TestIntegrationPgstopFastStopNothingToMark(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms"})
	rows, last := insertDelivered(t, e, 20)
	waitMarked(t, e, rows, 10*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 30*time.Second)
	took := pgstopFastWithin(t, e, "the walsender did not exit with nothing to mark")
	t.Logf("fast stop took %s with nothing to mark", took.Round(time.Millisecond))
	if strings.Contains(r.logs.String(), "database is shutting down; ending") {
		t.Fatal("the janitor ended the session though it had nothing to mark")
	}
}
