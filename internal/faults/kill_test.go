//go:build faults

package faults_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/jackc/pglogrepl"
)

// TestIntegrationKillAfterPublishBeforeConfirm SIGKILLs the relay process while
// events are published (the broker has routed them: the consumer has them)
// but their confirms have not reached the relay: a proxy holds everything
// the broker sends. The slot must stay before those events, and the next
// process publishes them again.
func TestIntegrationKillAfterPublishBeforeConfirm(t *testing.T) {
	w := newWorld(t, worldOptions{AMQPProxy: true})
	p := w.startProcess(processOptions{Race: true, Extra: map[string]string{"AMQP_HEARTBEAT": "60s"}})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)

	w.amqpProxy.HoldDownstream(true)
	held := w.insertCommits(t, 50, 10)
	w.waitIDs(t, ids(held), 30*time.Second) // published and routed
	boundary := w.commitLSN(t, held[0].ids[0])
	time.Sleep(time.Second) // room for a wrong status update
	if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
		t.Fatalf("slot at %s, past the first unconfirmed transaction (commit %s)", got, boundary)
	}
	p.kill(t)
	if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
		t.Fatalf("slot at %s after SIGKILL, past the first unconfirmed transaction (commit %s)", got, boundary)
	}
	w.amqpProxy.Reset()
	w.amqpProxy.HoldDownstream(false)

	restarted := time.Now()
	w.startProcess(processOptions{Race: true})
	w.waitAll(t, time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, w.commitLSN(t, held[len(held)-1].ids[0])+1, time.Minute)
	recovery := time.Since(restarted)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	o := w.checkRecovered(t, "relay SIGKILL after publish, before confirm", recovery,
		"500 events routed but unconfirmed when killed; recovery = new process start until the slot passed them")
	if o.Duplicates < 500 {
		t.Fatalf("%d duplicates: the 500 unconfirmed events were not all published again", o.Duplicates)
	}
}

// TestIntegrationKillAfterConfirmBeforeStatusUpdate SIGKILLs the relay process after
// the broker confirmed events but before PostgreSQL got the status update
// that reports them: a proxy holds what the relay sends on its replication
// connection, while the janitor's connection goes through, so the rows are
// marked (the slot may only move past marked rows) and the relay believes
// it reported them. The slot stays before them; the next process publishes
// them again (duplicates, never a gap).
func TestIntegrationKillAfterConfirmBeforeStatusUpdate(t *testing.T) {
	w := newWorld(t, worldOptions{PGProxy: true})
	p := w.startProcess(processOptions{Race: true})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)

	w.pgProxy.HoldUpstreamWhere(isReplicationStartup)
	held := w.insertCommits(t, 50, 10)
	w.waitIDs(t, ids(held), 30*time.Second)
	boundary := w.commitLSN(t, held[0].ids[0])
	last := w.commitLSN(t, held[len(held)-1].ids[0])
	// The relay has the confirms and believes it reported them.
	waitFor(t, "relay reports the confirmed events", 30*time.Second, func() bool {
		m, err := p.metrics("cdcrelay_confirmed_lsn")
		return err == nil && pglogrepl.LSN(m["cdcrelay_confirmed_lsn"]) > last
	})
	if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
		t.Fatalf("slot at %s although the status update is held (first unreported commit %s)", got, boundary)
	}
	p.kill(t)
	w.pgProxy.Reset() // the held status updates die with the connection
	w.pgProxy.HoldUpstream(false)
	if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
		t.Fatalf("slot at %s after SIGKILL, past the first unreported transaction (commit %s)", got, boundary)
	}

	restarted := time.Now()
	w.startProcess(processOptions{Race: true})
	w.waitAll(t, time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, last+1, time.Minute)
	recovery := time.Since(restarted)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	o := w.checkRecovered(t, "relay SIGKILL after confirm, before the status update", recovery,
		"500 events confirmed but unreported when killed; recovery = new process start until the slot passed them")
	if o.Duplicates < 500 {
		t.Fatalf("%d duplicates: the 500 unreported events were not all published again", o.Duplicates)
	}
}

// TestIntegrationKillInsideLargeTransaction SIGKILLs the relay process in the middle
// of publishing one 100,000-row transaction. The slot cannot move inside a
// transaction, so the next process publishes all of it again. The binary
// is built without -race here: 200,000 publishes under the race detector
// would take minutes.
func TestIntegrationKillInsideLargeTransaction(t *testing.T) {
	const big = 100_000
	w := newWorld(t, worldOptions{})
	p := w.startProcess(processOptions{})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)

	tx := w.insertCommits(t, 1, big)
	testenv.WaitCount(t, w.consumer, 1000+big/3, 2*time.Minute)
	boundary := w.commitLSN(t, tx[0].ids[0])
	p.kill(t)
	delivered := w.consumer.Count() - 1000
	if got := testenv.ConfirmedFlush(t, w.db, slotName); got > boundary {
		t.Fatalf("slot at %s, past the large transaction (commit %s)", got, boundary)
	}

	restarted := time.Now()
	w.startProcess(processOptions{})
	w.waitAll(t, 3*time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, boundary+1, time.Minute)
	recovery := time.Since(restarted)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	o := w.checkRecovered(t, "relay SIGKILL inside a 100,000-row transaction", recovery,
		fmt.Sprintf("killed after %d of its events were delivered; recovery = new process start until the slot passed the transaction (all of it published again)", delivered))
	if o.Duplicates < delivered {
		t.Fatalf("%d duplicates, want at least the %d delivered before the kill", o.Duplicates, delivered)
	}
}

// isReplicationStartup reports whether a PostgreSQL client's first message
// is the startup message of a replication connection (its parameters name
// "replication").
func isReplicationStartup(first []byte) bool {
	return bytes.Contains(first, []byte("replication\x00"))
}
