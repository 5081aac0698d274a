//go:build pgmatrix

package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// This file needs PostgreSQL 16 or later (pgoutput's origin option): make
// test-pg-matrix runs it (build tag pgmatrix).

const originSlot = "cdcrelay_origin"

// grantOrigins gives the relay's role the origin functions
// (docs/least-privilege.md), which turns CDCRELAY_MARK_ORIGIN=auto on.
func grantOrigins(t *testing.T, db *pgx.Conn) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		GRANT EXECUTE ON FUNCTION pg_replication_origin_oid(text) TO cdcrelay_app;
		GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text) TO cdcrelay_app;
		GRANT EXECUTE ON FUNCTION pg_replication_origin_session_setup(text) TO cdcrelay_app;`)
	if err != nil {
		t.Fatal(err)
	}
}

// spilled reads how many bytes the slot's decoding has spilled to disk.
func spilled(t *testing.T, db *pgx.Conn) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), `SELECT coalesce((SELECT spill_bytes FROM pg_stat_replication_slots WHERE slot_name = $1), 0)`, originSlot).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// markSpill inserts n rows in transactions of 100 (too small to spill),
// waits until they are delivered and marked by one janitor UPDATE (the
// relay runs with MARK_BATCH=n and a long interval) and the slot has
// passed the marks, and returns the bytes decoding spilled meanwhile: the
// marking's. The walsender's statistics reach the view late (seconds):
// with spills expected it waits for them to appear (30 s at most), else
// it gives them 8 s.
func markSpill(t *testing.T, e *env, n int, expect bool) int64 {
	t.Helper()
	before := spilled(t, e.db)
	sizes := make([]int, n/100)
	for i := range sizes {
		sizes[i] = 100
	}
	rows, _ := insertTxns(t, e.db, "k", sizes...)
	waitAll(t, e.consumer, rows, 120*time.Second)
	waitMarked(t, e, rows, 60*time.Second)
	var lsn string
	if err := e.db.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "the slot passes the marks", func() bool {
		var passed bool
		return e.db.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`, lsn, originSlot).Scan(&passed) == nil && passed
	})
	if !expect {
		time.Sleep(8 * time.Second)
		return spilled(t, e.db) - before
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if d := spilled(t, e.db) - before; d > 0 {
			return d
		}
	}
	return 0
}

// TestIntegrationMarkOriginSkipsDecoding: with the origin grants, the
// janitor's marking transaction of 10,000 rows is skipped by the
// walsender (nothing spilled with logical_decoding_work_mem=64kB); with
// CDCRELAY_MARK_ORIGIN=off the same marking spills.
func TestIntegrationMarkOriginSkipsDecoding(t *testing.T) {
	testenv.RequireMajor(t, 16)
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}}, "#")
	grantOrigins(t, e.db)
	vars := map[string]string{"SLOT": originSlot, "MARK_BATCH": "10000", "MARK_INTERVAL": "10m"}
	r := e.startRelay(vars)
	r.waitStreaming(t)
	with := markSpill(t, e, 10000, false)
	var origins int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_origin WHERE roname = 'cdcrelay_'||$1||'_marks'`, originSlot).Scan(&origins); err != nil || origins != 1 {
		t.Fatalf("the janitor's origin: %d, %v", origins, err)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	vars["MARK_ORIGIN"] = "off"
	r = e.startRelay(vars)
	r.waitStreaming(t)
	without := markSpill(t, e, 10000, true)
	if with != 0 || without == 0 {
		t.Fatalf("decoding spilled %d bytes for a 10,000-row marking with the origin, %d without; want 0 with it and more without", with, without)
	}
	t.Logf("a 10,000-row marking transaction: %d bytes spilled with the origin, %d without", with, without)
}

// TestIntegrationMarkOriginNeverSkipsForeignInserts: a replication origin
// that is not a relay's exists (as a subscription's would), and an outbox
// row is inserted by a session that carries it. The relay then does not
// filter by origin, and delivers the row.
func TestIntegrationMarkOriginNeverSkipsForeignInserts(t *testing.T) {
	testenv.RequireMajor(t, 16)
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	grantOrigins(t, e.db)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `SELECT pg_replication_origin_create('other_app_origin')`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"SLOT": originSlot})
	r.waitStreaming(t)
	applier := e.connect()
	if _, err := applier.Exec(ctx, `SELECT pg_replication_origin_session_setup('other_app_origin')`); err != nil {
		t.Fatal(err)
	}
	rows, _ := insertTxns(t, applier, "k", 10)
	waitAll(t, e.consumer, rows, 30*time.Second)
	if !strings.Contains(r.logs.String(), "not a relay's") {
		t.Error("the relay did not say why it decodes every origin")
	}
}
