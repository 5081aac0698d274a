//go:build faults

package relay_test

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationLockLostDuringDrain (docs/architecture.md, "Stopping"):
// a relay drains after SIGTERM, waiting for confirms a blocked broker
// holds back, and loses the slot lock meanwhile. Another relay may be
// taking over, so the drain ends at once rather than at
// SHUTDOWN_TIMEOUT (2 min here), the process exits 0, and a relay
// started once the broker reads again delivers every event. An
// adoption's drain went on to the timeout before (nothing else ended
// it); a streaming session's ended when the closed replication socket
// failed its reader.
func TestIntegrationLockLostDuringDrain(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	for _, adopting := range []bool{false, true} {
		name := "streaming"
		if adopting {
			name = "adopting"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lockLostDuringDrain(t, adopting)
		})
	}
}

func lockLostDuringDrain(t *testing.T, adopting bool) {
	const shutdownTimeout = 2 * time.Minute
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	// Registered after the node, so it runs before the node is stopped.
	t.Cleanup(func() { _ = rmq.SetMemoryHighWatermark(context.Background(), 0.4) })
	e := shutdownEnv(t, rmq.URL())
	addr := freeAddr(t)
	vars := map[string]string{"HTTP_ADDR": addr, "LOG_LEVEL": "info", "SHUTDOWN_TIMEOUT": shutdownTimeout.String()}
	var all []row
	block := func() {
		// The broker blocks the relay's connection: what it publishes
		// now stays unconfirmed, and a drain waits for it.
		if err := rmq.SetMemoryHighWatermark(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
	}
	var p *testenv.Process
	if adopting {
		all = backlog(t, e.db, "backlog", 200)
		block()
		p = e.startProcess(vars)
		for began := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			if code, _ := readyz(addr); code != 0 {
				break // serving /metrics
			}
			if time.Since(began) > time.Minute {
				t.Fatalf("the relay does not serve %s a minute after its start", addr)
			}
		}
	} else {
		p = e.startProcess(vars)
		waitReady(t, addr, "streaming", time.Minute)
		all, _ = insertTxns(t, e.db, "before", 10)
		waitAll(t, e.consumer, all, 30*time.Second)
		block()
		held, _ := insertTxns(t, e.db, "held", 10, 10)
		all = slices.Concat(all, held)
	}
	shutdownWaitMetric(t, addr, "unconfirmed events on the blocked broker", func(m map[string]float64) bool {
		return m[brokerBlockedSeries] == 1 && m["cdcrelay_confirms_in_flight"] > 0
	})
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Draining: still running a few seconds on, with confirms in flight.
	const drained = 3 * time.Second
	time.Sleep(drained)
	if done, err := p.Exited(); done {
		t.Fatalf("relay exited (%v) before the lock was lost: no drain to cut short", err)
	}
	holder := slotownLockHolder(t, e.db)
	if holder == 0 {
		t.Fatal("nobody holds the slot lock while the relay drains")
	}
	if _, err := e.db.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, holder); err != nil {
		t.Fatal(err)
	}
	took := shutdownWaitExit(t, p, time.Now(), 30*time.Second)
	if !strings.Contains(p.Log.String(), "lost the slot lock") {
		t.Fatalf("the relay did not log the lost slot lock:\n%s", testenv.Tail(p.Log.String(), 40))
	}

	if err := rmq.SetMemoryHighWatermark(context.Background(), 0.4); err != nil {
		t.Fatal(err)
	}
	p2 := e.startProcess(vars)
	// Streaming before the SIGTERM below: what the broker held may arrive
	// before p2 has even set up its signal handling.
	waitReady(t, addr, "streaming", time.Minute)
	waitAll(t, e.consumer, all, time.Minute)
	dups := report(t, all, e.consumer.Deliveries())
	if err := p2.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	shutdownWaitExit(t, p2, time.Now(), 30*time.Second)
	t.Logf("lock lost %s into the drain: relay exited after %s (SHUTDOWN_TIMEOUT %s); the next relay delivered all %d events, %d duplicates",
		drained, took.Round(10*time.Millisecond), shutdownTimeout, len(all), dups)
}
