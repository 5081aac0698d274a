//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationPostgresBlackhole partitions the relay from PostgreSQL (no RST, no
// FIN: bytes just stop) for 25s under a steady load, then heals it. The
// relay must notice the silent replication connection within twice
// wal_sender_timeout (as PostgreSQL notices a silent relay within
// wal_sender_timeout), its connection attempts through the partition must
// fail rather than hang, and once the partition heals every event must
// arrive.
func TestIntegrationPostgresBlackhole(t *testing.T) {
	const (
		walSenderTimeout = 5 * time.Second
		partition        = 25 * time.Second
	)
	w := newWorld(t, worldOptions{PGProxy: true, PG: testenv.PostgresOptions{Settings: map[string]string{
		"wal_sender_timeout": walSenderTimeout.String(),
	}}})
	r := w.startRelay(nil)
	r.waitStreaming(t)

	l := w.load(4000, 120, 3)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	w.pgProxy.Blackhole(true)
	detected := time.Duration(0)
	for time.Since(fault) < partition {
		if detected == 0 && r.restarts(t) > 0 {
			detected = time.Since(fault)
		}
		time.Sleep(50 * time.Millisecond)
	}
	attempts := r.metric(t, "cdcrelay_connect_failures_total")
	healed := time.Now()
	w.pgProxy.Blackhole(false)
	l.wait(t, 2*time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	note := "the relay did not notice the partition while it lasted"
	if detected > 0 {
		note = fmt.Sprintf("noticed after %s", detected.Round(100*time.Millisecond))
	}
	note += fmt.Sprintf(" (wal_sender_timeout %s); %v failed connection attempts during the partition", walSenderTimeout, attempts)
	w.check(t, fmt.Sprintf("PostgreSQL link black-holed %s under load", partition), healed, l.since(fault), note)
	t.Logf("relay failures: %s", strings.Join(r.failures(), " | "))
	switch {
	case detected == 0:
		t.Errorf("the relay never noticed the %s partition, want within %s: the replication connection has no liveness check", partition, 2*walSenderTimeout)
	case detected > 2*walSenderTimeout:
		t.Errorf("the relay noticed the partition after %s, want within %s", detected, 2*walSenderTimeout)
	}
	if attempts < 1 {
		t.Errorf("no failed connection attempt in %s of partition: connecting to PostgreSQL hangs instead of timing out", partition)
	}
}

// TestIntegrationPostgresCrashRestart crashes PostgreSQL (pg_ctl restart -m
// immediate: recovery on start) under a steady load. The loader reconnects
// too; rows whose COMMIT outcome it never learnt are taken from the table.
func TestIntegrationPostgresCrashRestart(t *testing.T) {
	w := newWorld(t, worldOptions{})
	r := w.startRelay(nil)
	r.waitStreaming(t)

	l := w.load(4000, 500, 5)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.pg.Restart(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	w.db = w.connect()
	l.wait(t, 2*time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	w.check(t, "PostgreSQL crash (pg_ctl restart -m immediate) under load", up, l.since(fault),
		fmt.Sprintf("server down %s", up.Sub(fault).Round(100*time.Millisecond)))
	t.Logf("relay failures: %s", strings.Join(r.failures(), " | "))
}
