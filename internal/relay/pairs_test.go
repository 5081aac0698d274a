package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// TestIntegrationAdoptionPairsUnderLoad: adoptions (the slot dropped while
// the relay is down, so the next start publishes the unmarked rows from a
// new slot's snapshot) under a steady insert load. Every (commit LSN,
// index) pair belongs to one event, and the rule docs/messages.md gives
// consumers holds for every delivery: a pair smaller than one already
// delivered is a redelivery. On the old relay a transaction whose commit
// record starts exactly at the consistent point tied with a snapshot row
// (3 ties in 12 adoptions under about 300 tx/s).
func TestIntegrationAdoptionPairsUnderLoad(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	stop := make(chan struct{})
	// Two producers of one-row transactions, as fast as they go: a commit
	// record right at a new slot's consistent point needs many commits
	// around each slot's creation.
	during := []<-chan []row{produce(t, e, "a", 1, 0, stop), produce(t, e, "b", 1, 0, stop)}
	const adoptions = 12
	for i := range adoptions {
		r := e.startRelay(nil)
		r.waitStreaming(t)
		time.Sleep(time.Duration(200+50*i) * time.Millisecond)
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		dropSlot(t, e)
	}
	r := e.startRelay(nil)
	r.waitStreaming(t)
	close(stop)
	var all []row
	for _, c := range during {
		all = append(all, <-c...)
	}
	waitAll(t, e.consumer, all, 2*time.Minute)

	owner := map[relaytest.Position]string{}
	seen := map[string]bool{}
	var top relaytest.Position
	for i, d := range e.consumer.Deliveries() {
		p, err := relaytest.PositionOf(d)
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := owner[p]; ok && id != d.MessageID {
			t.Fatalf("events %s and %s share the pair %s/%d", id, d.MessageID, p.LSN, p.Index)
		}
		owner[p] = d.MessageID
		if top.After(p) && !seen[d.MessageID] {
			t.Fatalf("delivery %d: event %s at %s/%d is a first delivery after %s/%d: the documented redelivery rule would discard it",
				i, d.MessageID, p.LSN, p.Index, top.LSN, top.Index)
		}
		if p.After(top) {
			top = p
		}
		seen[d.MessageID] = true
	}
	dups := report(t, all, e.consumer.Deliveries())
	t.Logf("%d adoptions under load: %d events, %d deliveries (%d duplicates), %d distinct pairs",
		adoptions+1, len(all), len(e.consumer.Deliveries()), dups, len(owner))
}

// dropSlot drops the relay's slot once its walsender has let go.
func dropSlot(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.db.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slotName)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
