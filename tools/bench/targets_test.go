package main

import (
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	const inserter = 42
	tests := []struct {
		name string
		be   pgBackend
		want pgClass
	}{
		{"walsender", pgBackend{pid: 7, backendType: "walsender", app: "cdcrelay", user: relayRole, query: "START_REPLICATION SLOT x LOGICAL 0/0"}, classWalsender},
		{"inserter", pgBackend{pid: inserter, backendType: "client backend", query: "INSERT INTO event_outbox ..."}, classInserter},
		{"no inserter known", pgBackend{pid: 0, backendType: "client backend"}, classOther},
		{"drainer", pgBackend{pid: 8, backendType: "client backend", user: drainerRole, query: drainSQL(drainerBatch)}, classDrainer},
		{"janitor marking", pgBackend{pid: 9, backendType: "client backend", app: "cdcrelay", user: relayRole,
			query: "WITH marked AS (UPDATE event_outbox SET published_at = now() WHERE id = ANY($1::uuid[]) AND published_at IS NULL RETURNING 1) SELECT 1"}, classJanitor},
		{"janitor parking", pgBackend{pid: 9, backendType: "client backend", app: "cdcrelay", query: "UPDATE event_outbox SET attempts = attempts + 1, last_error = left($2, 2000)"}, classJanitor},
		{"janitor start-up", pgBackend{pid: 9, backendType: "client backend", app: "cdcrelay", query: "SELECT format_type(a.atttypid, a.atttypmod),\n\t\t       EXISTS (SELECT 1 FROM pg_index i"}, classJanitor},
		{"monitor refresh", pgBackend{pid: 10, backendType: "client backend", app: "cdcrelay", query: "SELECT b.unpublished FROM (SELECT count(*) FILTER (WHERE true) AS unpublished"}, classMonitor},
		{"monitor inspect", pgBackend{pid: 10, backendType: "client backend", app: "cdcrelay", query: "SELECT coalesce(bool_or(attname = 'enqueued_at'), false)"}, classMonitor},
		{"slot lock", pgBackend{pid: 11, backendType: "client backend", app: "cdcrelay", query: "SELECT pg_try_advisory_lock($1, hashtext($2))"}, classRelay},
		{"retention", pgBackend{pid: 12, backendType: "client backend", app: "cdcrelay retention", query: "DELETE FROM event_outbox"}, classRelay},
		{"bench's own", pgBackend{pid: 13, backendType: "client backend", app: "", query: "CHECKPOINT"}, classOther},
		{"checkpointer", pgBackend{pid: 14, backendType: "checkpointer"}, classOther},
		{"autovacuum", pgBackend{pid: 15, backendType: "autovacuum worker", query: "autovacuum: VACUUM event_outbox"}, classOther},
		{"preflight is not the relay", pgBackend{pid: 16, backendType: "client backend", app: "psql", query: "UPDATE event_outbox SET published_at = now()"}, classOther},
	}
	for _, tt := range tests {
		if got := classify(tt.be, inserter); got != tt.want {
			t.Errorf("%s: classify = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSplitCPU(t *testing.T) {
	ms := time.Millisecond
	start := map[int]pgProc{
		1: {classWalsender, 100 * ms},
		2: {classRelay, 5 * ms},    // the janitor before its first statement
		3: {classMonitor, 20 * ms}, // exits inside the window
		4: {classOther, 50 * ms},
		6: {classInserter, 900 * ms}, // pid reused: its counter went down
	}
	end := map[int]pgProc{
		1: {classWalsender, 400 * ms},
		2: {classJanitor, 205 * ms},
		4: {classOther, 80 * ms},
		5: {classDrainer, 30 * ms}, // started inside the window
		6: {classInserter, 10 * ms},
	}
	got := splitCPU(start, end, 1000*ms)
	want := map[pgClass]time.Duration{
		classWalsender: 300 * ms, classJanitor: 200 * ms, classDrainer: 30 * ms, classInserter: 10 * ms,
		classOther: 460 * ms, // 1000 - 540: the exited monitor, pid 4, the postmaster
	}
	for c, d := range want {
		if got.cpu[c] != d {
			t.Errorf("%s: %v, want %v", c, got.cpu[c], d)
		}
	}
	if got.cpu[classMonitor] != 0 || got.backends[classMonitor] != 0 || got.backends[classJanitor] != 1 || got.backends[classOther] != 1 {
		t.Errorf("backends %v, cpu %v", got.backends, got.cpu)
	}
	if b := got.relaysBehalf(); b != 500*ms {
		t.Errorf("relay's behalf %v, want walsender+janitor 500ms", b)
	}
	// A janitor that only showed its start-up statement keeps its class;
	// a relay connection unknown at both ends stays "relay, other".
	got = splitCPU(map[int]pgProc{2: {classJanitor, 0}, 3: {classRelay, 0}}, map[int]pgProc{2: {classRelay, ms}, 3: {classRelay, ms}}, ms)
	if got.cpu[classJanitor] != ms || got.cpu[classRelay] != ms || got.cpu[classOther] != 0 {
		t.Errorf("merged classes %v (other clamps at 0)", got.cpu)
	}
}

func TestParseSchedstat(t *testing.T) {
	if d, err := parseSchedstat("79125009 16490245 444\n"); err != nil || d != 79125009 {
		t.Errorf("parseSchedstat = %v, %v", d, err)
	}
	for _, bad := range []string{"", "x 1 2", "-5 1 2"} {
		if _, err := parseSchedstat(bad); err == nil {
			t.Errorf("parseSchedstat(%q): no error", bad)
		}
	}
}

func TestPerEventAndCapacity(t *testing.T) {
	if got := perEvent(2*time.Second, 100_000); got != 20*time.Microsecond {
		t.Errorf("perEvent = %v", got)
	}
	if perEvent(time.Second, 0) != 0 || capacity(0) != 0 {
		t.Error("no events or no CPU must give 0, not a division by zero")
	}
	if got := capacity(12500 * time.Nanosecond); got != 80_000 {
		t.Errorf("capacity(12.5µs) = %v, want 80,000 ev/s", got)
	}
}

// targetResults is a run whose every measure is set from the figures
// given, for the met logic.
func targetResults(relayDrain, relay1k, relay5k, pgDrain, pg1k, drainer time.Duration, p99, ref1k, rss int64) *results {
	split := func(walsender, janitor time.Duration) pgSplit {
		return pgSplit{cpu: map[pgClass]time.Duration{classWalsender: walsender, classJanitor: janitor, classInserter: time.Hour}}
	}
	ph := func(rate, perTx int) latencyPhase {
		return latencyPhase{rate: rate, perTx: perTx, targets: defaultTargets[[2]int{rate, perTx}]}
	}
	ceiling := rateResult{events: 10_000, took: time.Second}
	return &results{
		ceilings: [2]rateResult{ceiling, ceiling},
		drain:    rateResult{events: 10_000, took: time.Second, use: usage{relay: relayDrain * 10_000, pgSplit: split(pgDrain*10_000/2, pgDrain*10_000/2)}},
		drainer:  rateResult{events: 1000, took: time.Second, use: usage{pgSplit: pgSplit{cpu: map[pgClass]time.Duration{classDrainer: drainer * 1000}}}},
		lat: []latencyResult{
			{phase: ph(1000, 1), events: 1000, p99: time.Duration(p99), use: usage{relay: relay1k * 1000, pgSplit: split(pg1k*1000, 0)}},
			{phase: ph(5000, 10), events: 5000, p99: time.Duration(p99), use: usage{relay: relay5k * 5000}},
		},
		ref:           []latencyResult{{p99: time.Duration(ref1k)}, {p99: time.Duration(ref1k)}},
		rssBacklog:    rss,
		rssBigTx:      rss,
		rssBigPayload: rss,
		bigPayload:    rateResult{events: 256},
	}
}

func TestTargetRows(t *testing.T) {
	us := time.Microsecond
	row := func(rows [][]string, prefix string) []string {
		for _, r := range rows {
			if strings.HasPrefix(r[0], prefix) {
				return r
			}
		}
		t.Fatalf("no row %q in %v", prefix, rows)
		return nil
	}
	opts := options{backlog: 10_000}
	// Every target met, at its limit.
	rows := (targetResults(12*us, 100*us, 25*us, 8*us, 8*us, 10*us, int64(3*time.Millisecond), int64(2*time.Millisecond), rssTarget)).targetRows(opts)
	if missed := missedTargets(rows); len(missed) != 0 {
		t.Errorf("at the limits, missed %v", missed)
	}
	if r := row(rows, "relay CPU per event, draining"); r[1] != "12.0 µs" || r[4] != "≤ 12.0 µs" || r[5] != "yes" {
		t.Errorf("draining row %v", r)
	}
	if r := row(rows, "PostgreSQL CPU per event for the relay (walsender+janitor+monitor), draining"); r[1] != "8.0 µs" || r[3] != "0.80" || r[5] != "yes" {
		t.Errorf("PostgreSQL row %v: the inserter is not on the relay's behalf", r)
	}
	if r := row(rows, "p99 commit → consumer, 1,000 ev/s"); r[3] != "1.50" || r[5] != "yes" {
		t.Errorf("p99 row %v", r)
	}
	if r := row(rows, "p99 commit → consumer, 5,000 ev/s"); r[4] != "≤ 2.0×" || r[5] != "yes" {
		t.Errorf("p99 row %v", r)
	}
	if r := row(rows, "relay capacity on one dedicated core"); r[1] != "83,333 ev/s" || r[5] != "" {
		t.Errorf("capacity row %v: 10^6/12 µs, an observation", r)
	}
	if r := row(rows, "drain / one-channel broker ceiling"); r[1] != "1.00" || r[4] != "observation" || r[5] != "" {
		t.Errorf("drain ratio row %v", r)
	}
	// Every target missed by a little.
	rows = (targetResults(13*us, 101*us, 26*us, 9*us, 9*us, 10*us, int64(5*time.Millisecond), int64(2*time.Millisecond), rssTarget+1)).targetRows(opts)
	missed := missedTargets(rows)
	if len(missed) != 10 {
		t.Errorf("just over every limit, missed %d: %v", len(missed), missed)
	}
	// No polling drainer measured: the ratio is n/a and not met.
	rows = (targetResults(12*us, 100*us, 25*us, 8*us, 8*us, 0, int64(time.Millisecond), int64(time.Millisecond), rssTarget)).targetRows(opts)
	if r := row(rows, "PostgreSQL CPU per event for the relay (walsender+janitor+monitor), draining"); r[3] != "n/a" || r[5] != "NO" {
		t.Errorf("unmeasured reference %v", r)
	}
	// Phases other than the issue's: their rows say so.
	r := targetResults(12*us, 100*us, 25*us, 8*us, 8*us, 10*us, 1, 1, rssTarget)
	r.lat, r.ref = nil, nil
	if got := row(r.targetRows(opts), "relay CPU per event, 1,000 ev/s"); got[1] != "not measured (-phases)" {
		t.Errorf("missing phase row %v", got)
	}
}
