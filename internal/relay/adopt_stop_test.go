package relay_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationAdoptionStopDrains sends SIGTERM in the middle of an
// adoption's backlog, with hundreds of messages in flight: the relay stops
// reading the snapshot, waits for the broker's confirms of what it sent and
// for their marks, and exits cleanly. Every row delivered by then is
// marked, so the next start (which redoes the adoption from a new
// snapshot) publishes none of them again: 0 duplicates, 0 missing.
func TestIntegrationAdoptionStopDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	old := backlog(t, e.db, "backlog", 20000)
	p := e.startProcess(map[string]string{"MAX_IN_FLIGHT": "500", "SHUTDOWN_TIMEOUT": "20s"})
	testenv.WaitCount(t, e.consumer, 2000, time.Minute)
	signalled := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 30*time.Second); !isExit(err, 0) {
		t.Fatalf("relay stopped during an adoption: %v, want a clean exit\n%s", err, p.Log.String())
	}
	took := time.Since(signalled)
	if !strings.Contains(p.Log.String(), "stopped the adoption") {
		t.Fatalf("the relay did not report a drained stop of the adoption:\n%s", p.Log.String())
	}
	delivered := e.consumer.Deliveries()
	if len(delivered) >= len(old) {
		t.Fatalf("the backlog was done (%d deliveries) before the stop; the test did not interrupt it", len(delivered))
	}
	// Every message the relay sent was confirmed and its row marked
	// before it exited: a delivery seen now (or arriving later) is a
	// marked row.
	ids := make([]string, len(delivered))
	for i, d := range delivered {
		ids[i] = d.MessageID
	}
	var unmarked int
	if err := e.db.QueryRow(context.Background(),
		`SELECT count(*) FROM event_outbox WHERE id::text = ANY($1) AND published_at IS NULL`, ids).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked > 0 {
		t.Fatalf("%d of the %d rows delivered before the stop are unmarked: the stop did not drain", unmarked, len(delivered))
	}

	e.startProcess(nil)
	waitAll(t, e.consumer, old, 2*time.Minute)
	waitMarked(t, e, old, 30*time.Second)
	dups := report(t, old, e.consumer.Deliveries())
	t.Logf("SIGTERM after %d of %d backlog rows delivered: exited in %s, 0 unmarked, 0 missing, %d duplicates after the restart",
		len(delivered), len(old), took.Round(time.Millisecond), dups)
	if dups > 0 {
		t.Fatalf("%d rows published again after a drained stop of the adoption", dups)
	}
}
