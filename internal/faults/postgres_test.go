package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationPostgresLinkReset cuts the relay's PostgreSQL connections (the
// replication stream and the janitor's) with an RST under a steady load.
func TestIntegrationPostgresLinkReset(t *testing.T) {
	w := newWorld(t, worldOptions{PGProxy: true})
	r := w.startRelay(nil)
	r.waitStreaming(t)

	l := w.load(3000, 1500, 10)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	w.pgProxy.Reset()
	l.wait(t, time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	if n := r.restarts(t); n < 1 {
		t.Fatalf("%d pipeline restarts after a reset", n)
	}
	w.check(t, "PostgreSQL link reset (RST) under load", fault, l.since(fault), "")
}

// TestIntegrationPostgresTerminateWalsender kills the walsender serving the relay with
// pg_terminate_backend under a steady load.
func TestIntegrationPostgresTerminateWalsender(t *testing.T) {
	w := newWorld(t, worldOptions{})
	r := w.startRelay(nil)
	r.waitStreaming(t)
	pid := testenv.WaitSlotActive(t, w.db, slotName, 10*time.Second)

	l := w.load(3000, 1500, 10)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	var ok bool
	if err := w.db.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
	l.wait(t, time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	if now := testenv.Walsender(t, w.db, slotName); now == pid || now == 0 {
		t.Fatalf("walsender pid %d after terminating %d", now, pid)
	}
	w.check(t, "walsender killed (pg_terminate_backend) under load", fault, l.since(fault), "")
}
