package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// keyOnLane returns a routing key under ok. that takes the given lane of n.
func keyOnLane(t *testing.T, lane, n int) string {
	t.Helper()
	for i := range 1000 {
		if k := fmt.Sprintf("ok.k%d", i); publish.LaneOf(k, n) == lane {
			return k
		}
	}
	t.Fatalf("no key found for lane %d of %d", lane, n)
	return ""
}

// TestIntegrationLanesStallNoRepublish: duplicates stay bounded with lanes:
// with two publishing channels, an unroutable row stalls its lane while
// the other lane's events after it flow. Those are acknowledged and
// marked but lie past the stalled row, so the slot cannot pass them;
// every retry of the stall used to publish them again (a reproduction:
// one row delivered 34 times in 60 s). They are remembered as done and
// skipped: each is delivered once while the stall lasts, the stalled
// lane's later events wait, and a binding releases everything.
func TestIntegrationLanesStallNoRepublish(t *testing.T) {
	t.Parallel() // waits for retries of a stall: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "ok.#")
	r := e.startRelay(map[string]string{"PUBLISH_CHANNELS": "2", "BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s"})
	r.waitStreaming(t)
	stalledLane := publish.LaneOf("nowhere", 2)
	other, same := keyOnLane(t, 1-stalledLane, 2), keyOnLane(t, stalledLane, 2)
	unrouted, last := insertTxns(t, e.db, "nowhere", 1)
	flowing, _ := insertTxns(t, e.db, other, 1, 1, 1)
	waitAll(t, e.consumer, flowing, 30*time.Second)
	// Committed once the stall is under way, so that no session's first
	// burst (published before the return arrives) carries them.
	first := time.Now().Add(30 * time.Second)
	for gauge(t, r.reg, "cdcrelay_pipeline_restarts_total") < 1 {
		if time.Now().After(first) {
			t.Fatal("the unroutable row did not end a session in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	held, _ := insertTxns(t, e.db, same, 1, 1)
	restarts := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")
	deadline := time.Now().Add(60 * time.Second)
	// The stall stays exported through every retry: the other lane's
	// events, skipped at each session's start, lie past the stalled row
	// but do not end its stall (an alert on the series must not flap).
	samples, gaps := 0, 0
	for gauge(t, r.reg, "cdcrelay_pipeline_restarts_total") < restarts+8 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled row did not make the relay retry 8 times in 60 s")
		}
		if samples++; stalledLabels(t, r.reg)["id"] != unrouted[0].id {
			gaps++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if gaps > 0 {
		t.Errorf("cdcrelay_stalled_event_info did not name the stalled row in %d of %d samples taken while it stalled the stream", gaps, samples)
	}
	if most := mostDeliveries(flowing, e.consumer.Deliveries()); most != 1 {
		t.Errorf("an event of the other lane was delivered %d times over %v retries of the stall; once, since it was acknowledged and marked",
			most, gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")-restarts)
	}
	if n := mostDeliveries(held, e.consumer.Deliveries()); n != 0 {
		t.Errorf("an event behind the stalled row on its lane was delivered (%d times) before it", n)
	}
	if labels := stalledLabels(t, r.reg); labels["id"] != unrouted[0].id {
		t.Errorf("cdcrelay_stalled_event_info %v, want the row %s", labels, unrouted[0].id)
	}
	waitReturnedUntilRouted(t, e, unrouted, last)
	waitAll(t, e.consumer, append(append([]row(nil), flowing...), held...), 30*time.Second)
	if most := mostDeliveries(flowing, e.consumer.Deliveries()); most != 1 {
		t.Errorf("an event of the other lane was delivered %d times in all", most)
	}
	t.Logf("%v retries of the stall; the other lane's 3 events delivered once each, the stalled lane's 2 held until the binding",
		gauge(t, r.reg, "cdcrelay_pipeline_restarts_total")-restarts)
}
