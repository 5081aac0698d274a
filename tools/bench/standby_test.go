package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func TestParseInstallPostgres(t *testing.T) {
	out := "13 /var/cache/pg/13.23.0/native/bin\n" +
		"install-postgres: fetching PostgreSQL 16 (x)\n" +
		"16 /var/cache/pg/16.14.0/native/bin\n" +
		"17  /var/cache/pg/17.10.0/native/bin  \n" +
		"18 relative/bin\n" + // not absolute: not a listing line
		"9 /old/bin\n\n"
	got := parseInstallPostgres(out)
	want := []pgBuild{{13, "/var/cache/pg/13.23.0/native/bin"}, {16, "/var/cache/pg/16.14.0/native/bin"}, {17, "/var/cache/pg/17.10.0/native/bin"}}
	if len(got) != len(want) {
		t.Fatalf("parseInstallPostgres = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %v, want %v", i, got[i], want[i])
		}
	}
}

func TestPickStandbyBuild(t *testing.T) {
	all := []pgBuild{{13, "/13"}, {14, "/14"}, {16, "/16"}, {17, "/17"}, {18, "/18"}}
	if b, ok := pickStandbyBuild(all); !ok || b.major != 17 {
		t.Errorf("with 17 cached: %v %t, want 17 (fixed, so runs compare)", b, ok)
	}
	if b, ok := pickStandbyBuild([]pgBuild{{16, "/16"}, {18, "/18"}, {14, "/14"}}); !ok || b.major != 18 {
		t.Errorf("without 17: %v %t, want the newest 16+", b, ok)
	}
	for _, none := range [][]pgBuild{nil, {{13, "/13"}, {15, "/15"}}} {
		if b, ok := pickStandbyBuild(none); ok {
			t.Errorf("%v: picked %v, want none (decoding on a standby needs 16)", none, b)
		}
	}
}

func TestWithPGBin(t *testing.T) {
	t.Setenv(testenv.PGBinEnv, "/usual")
	var inside string
	_ = withPGBin("/pg17/bin", func() error { inside = os.Getenv(testenv.PGBinEnv); return nil })
	if inside != "/pg17/bin" || os.Getenv(testenv.PGBinEnv) != "/usual" {
		t.Errorf("inside %q, after %q", inside, os.Getenv(testenv.PGBinEnv))
	}
	_ = withPGBin("", func() error { inside = os.Getenv(testenv.PGBinEnv); return nil })
	if inside != "/usual" {
		t.Errorf("dir \"\" changed the binaries: %q", inside)
	}
}

// TestClassifyByServer: the processes of a primary whose standby holds the
// slot, and of that standby.
func TestClassifyByServer(t *testing.T) {
	tests := []struct {
		server, name string
		be           pgBackend
		want         pgClass
	}{
		{"primary", "physical standby's walsender", pgBackend{pid: 1, backendType: "walsender", app: standbyName, user: "postgres", query: "START_REPLICATION SLOT bench_standby 0/3000000 TIMELINE 1"}, classPhysical},
		{"primary", "relay's walsender (slot on the primary)", pgBackend{pid: 2, backendType: "walsender", app: "cdcrelay", database: benchDatabase, query: "START_REPLICATION SLOT x LOGICAL 0/0"}, classWalsender},
		{"primary", "logical walsender renamed by its URL", pgBackend{pid: 3, backendType: "walsender", app: "orders", database: benchDatabase}, classWalsender},
		{"primary", "janitor after a flush", pgBackend{pid: 4, backendType: "client backend", app: "cdcrelay", database: benchDatabase,
			query: "SELECT pg_current_wal_insert_lsn()::text, coalesce(current_setting('synchronized_standby_slots', true), '')"}, classJanitor},
		{"primary", "janitor asking about late rows", pgBackend{pid: 4, backendType: "client backend", app: "cdcrelay",
			query: "WITH c AS (SELECT s) SELECT coalesce(array_agg(x), '{}') FROM unnest($1::bigint[]) AS x, c WHERE NOT pg_visible_in_snapshot(x, c.s)"}, classJanitor},
		{"primary", "monitor, backlog only", pgBackend{pid: 5, backendType: "client backend", app: "cdcrelay", query: "SELECT count(*) FILTER (WHERE last_error IS NULL) AS unpublished"}, classMonitor},
		{"primary", "slot creation asks for a snapshot", pgBackend{pid: 6, backendType: "client backend", app: "cdcrelay", query: "SELECT pg_log_standby_snapshot()"}, classRelay},
		{"standby", "startup (replay)", pgBackend{pid: 11, backendType: "startup"}, classReplay},
		{"standby", "walreceiver", pgBackend{pid: 12, backendType: "walreceiver"}, classReplay},
		{"standby", "relay's walsender", pgBackend{pid: 13, backendType: "walsender", app: "cdcrelay", database: benchDatabase}, classWalsender},
		{"standby", "cascading physical walsender", pgBackend{pid: 14, backendType: "walsender", app: "walreceiver"}, classPhysical},
		{"standby", "janitor's polling", pgBackend{pid: 15, backendType: "client backend", app: "cdcrelay", database: benchDatabase,
			query: "SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)"}, classJanitor},
		{"standby", "janitor's question after a promotion", pgBackend{pid: 20, backendType: "client backend", app: "cdcrelay", database: benchDatabase,
			query: "SELECT count(*) FROM public.event_outbox WHERE id = ANY($1::uuid[]) AND published_at IS NULL"}, classJanitor},
		{"standby", "monitor's slot gauges", pgBackend{pid: 16, backendType: "client backend", app: "cdcrelay",
			query: "SELECT s.wal_status FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w"}, classMonitor},
		{"standby", "session's wait for replay", pgBackend{pid: 17, backendType: "client backend", app: "cdcrelay",
			query: "SELECT NOT pg_is_in_recovery() OR pg_last_wal_replay_lsn() >= $1::pg_lsn"}, classRelay},
		{"standby", "bench's own", pgBackend{pid: 18, backendType: "client backend", query: "CHECKPOINT"}, classOther},
		{"standby", "checkpointer", pgBackend{pid: 19, backendType: "checkpointer"}, classOther},
	}
	for _, tt := range tests {
		if got := classify(tt.be, 0); got != tt.want {
			t.Errorf("%s, %s: classify = %q, want %q", tt.server, tt.name, got, tt.want)
		}
	}
	for _, c := range []pgClass{classPhysical, classReplay} {
		if onRelaysBehalf(c) {
			t.Errorf("%s counted on the relay's behalf: the standby is paid for whatever the relay does", c)
		}
	}
}

// standbyRun is a standby part whose primary spent primary per event for
// the relay (drain and 1,000 ev/s alike) against a drainer's drainer.
func standbyRun(primary, drainer time.Duration) *standbyResult {
	split := func(janitor, physical time.Duration, events int) pgSplit {
		n := time.Duration(events)
		return pgSplit{cpu: map[pgClass]time.Duration{classJanitor: janitor * n, classPhysical: physical * n, classInserter: time.Hour}}
	}
	standby := func(walsender time.Duration, events int) pgSplit {
		n := time.Duration(events)
		return pgSplit{cpu: map[pgClass]time.Duration{classWalsender: walsender * n, classReplay: time.Hour}}
	}
	return &standbyResult{
		postgres: "17.10",
		drainer:  rateResult{events: 1000, took: time.Second, use: usage{pgSplit: pgSplit{cpu: map[pgClass]time.Duration{classDrainer: drainer * 1000}}}},
		drainerLat: latencyResult{events: 5000, achieved: 1000, p50: 130 * time.Millisecond, p99: 260 * time.Millisecond,
			use: usage{pgSplit: pgSplit{cpu: map[pgClass]time.Duration{classDrainer: drainer * 5000}}}},
		standbyDrain: rateResult{events: 10_000, took: time.Second,
			use: usage{pgSplit: split(primary, 50*time.Microsecond, 10_000), sbSplit: standby(20*time.Microsecond, 10_000)}},
		primaryDrain: rateResult{events: 10_000, took: 2 * time.Second, use: usage{pgSplit: split(40*time.Microsecond, 0, 10_000)}},
		standbyLat: latencyResult{events: 5000, p50: 4 * time.Millisecond, p99: 9 * time.Millisecond,
			use: usage{pgSplit: split(primary, 60*time.Microsecond, 5000), sbSplit: standby(90*time.Microsecond, 5000)}},
		primaryLat:    latencyResult{events: 5000, p50: 2 * time.Millisecond, p99: 6 * time.Millisecond},
		standbyReplay: summary{n: 100, p50: 3 * time.Millisecond, p99: 7 * time.Millisecond},
		primaryReplay: summary{n: 99, p50: time.Millisecond, p99: 7 * time.Millisecond},
	}
}

func TestStandbyTargetRows(t *testing.T) {
	us := time.Microsecond
	rows := standbyRun(8*us, 10*us).targetRows()
	if len(rows) != 3 {
		t.Fatalf("rows %v", rows)
	}
	for i, what := range []string{"draining", "1,000 ev/s"} {
		r := rows[i]
		if !strings.HasSuffix(r[0], what) || r[1] != "8.0 µs" || r[3] != "0.80" || r[4] != "≤ 0.80" || r[5] != "yes" {
			t.Errorf("at the limit, %s: %v (the standby's walsender on the primary is not the relay's)", what, r)
		}
	}
	if r := rows[2]; r[1] != "9.00 ms" || r[3] != "1.50" || r[4] != "observation" || r[5] != "" {
		t.Errorf("p99 row %v: slot on the standby over slot on the primary", r)
	}
	if missed := missedTargets(standbyRun(9*us, 10*us).targetRows()); len(missed) != 2 {
		t.Errorf("just over the limit, missed %v", missed)
	}
	if missed := missedTargets(standbyRun(8*us, 0).targetRows()); len(missed) != 2 {
		t.Errorf("no drainer measured must not pass: missed %v", missed)
	}
}

// The paced target compares with the drainer at the paced rate, under the
// same insert load, unless that drainer fell behind the rate.
func TestStandbyPacedReference(t *testing.T) {
	us := time.Microsecond
	s := standbyRun(15*us, 10*us)
	s.drainerLat.use.pgSplit.cpu[classDrainer] = 20 * us * 5000
	rows := s.targetRows()
	if r := rows[0]; r[3] != "1.50" || r[5] != "NO" || !strings.Contains(r[2], "10.0 µs polling drainer's drain") {
		t.Errorf("draining row %v: against the drainer's drain", r)
	}
	if r := rows[1]; r[3] != "0.75" || r[5] != "yes" || !strings.Contains(r[2], "20.0 µs polling drainer at 1,000 ev/s") {
		t.Errorf("paced row %v: against the drainer at 1,000 ev/s", r)
	}
	if got := cells(s.notes(), "primary CPU per event for the relay, 1,000 ev/s"); len(got) != 5 || got[4] != "drainer 20.0 µs" {
		t.Errorf("notes row %v", got)
	}
	s.drainerLat.achieved = 899
	if r := s.targetRows()[1]; r[3] != "1.50" || r[5] != "NO" || !strings.Contains(r[2], "drainer's drain, same primary (paced: 899 ev/s)") {
		t.Errorf("a drainer that fell behind the rate is no reference: %v", r)
	}
	s.drainerLat = latencyResult{}
	if r := s.targetRows()[1]; r[5] != "NO" || !strings.Contains(r[2], "drain") {
		t.Errorf("no paced drainer measured: %v", r)
	}
}

func TestStandbyNotRun(t *testing.T) {
	s := &standbyResult{notRun: "the default binaries are PostgreSQL 15, and .ci/install-postgres listed no PostgreSQL 16 or later\nmore detail"}
	rows := s.targetRows()
	if len(rows) != 2 {
		t.Fatalf("rows %v", rows)
	}
	for _, r := range rows {
		if r[1] != "NOT RUN" || r[5] != "not run" {
			t.Errorf("row %v: an omitted part must say so in the table", r)
		}
	}
	if !strings.Contains(rows[0][2], "PostgreSQL 15") || strings.Contains(rows[0][2], "more detail") {
		t.Errorf("reason cell %q: the first line of why", rows[0][2])
	}
	if missed := missedTargets(rows); len(missed) != 0 {
		t.Errorf("a part that did not run is not a missed target (-strict): %v", missed)
	}
	if n := s.notes(); !strings.Contains(n, "THE STANDBY PART DID NOT RUN") || !strings.Contains(n, "PostgreSQL 15") {
		t.Errorf("notes:\n%s", n)
	}
	if b := s.banner(); !strings.HasPrefix(b, "standby part NOT RUN: the default binaries") {
		t.Errorf("banner %q", b)
	}
	if b := standbyRun(1, 1).banner(); b != "" {
		t.Errorf("a part that ran has no banner: %q", b)
	}
}

// cells finds the table line of text whose first cell is name and
// returns its cells, trimmed.
func cells(text, name string) []string {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Split(strings.Trim(line, "| "), "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if f[0] == name {
			return f
		}
	}
	return nil
}

func TestStandbyNotes(t *testing.T) {
	s := standbyRun(8*time.Microsecond, 10*time.Microsecond)
	n := s.notes()
	for _, want := range []struct {
		row   string
		cells []string
	}{
		{"primary CPU per event for the relay, draining", []string{"8.0 µs", "40.0 µs", "0.20", "drainer 10.0 µs"}},
		{"primary: the standby's walsender per event, draining", []string{"50.0 µs", "0.0 µs"}},
		{"standby CPU per event for the relay, 1,000 ev/s", []string{"90.0 µs", "0.0 µs", "n/a"}},
		{"commit → consumer p50, 1,000 ev/s, 1/tx", []string{"4.00 ms", "2.00 ms", "2.00"}},
		{"slot on the standby: drain", []string{"10,000", "0.0 µs", "360000.0 µs"}},
		{"the standby's replay lag while pacing, p50", []string{"3.00 ms", "1.00 ms", "3.00"}},
		{"the standby's replay lag while pacing, p99", []string{"7.00 ms", "7.00 ms", "1.00", "100 and 99 samples"}},
	} {
		got := cells(n, want.row)
		if len(got) < len(want.cells)+1 || strings.Join(got[1:len(want.cells)+1], "|") != strings.Join(want.cells, "|") {
			t.Errorf("row %q: %v, want %v", want.row, got, want.cells)
		}
	}
	if !strings.Contains(n, "PostgreSQL 17.10 primary") || !strings.Contains(n, "no such setting") {
		t.Errorf("notes:\n%s", n)
	}
	s.hasOrigin, s.origins = true, []string{"cdcrelay_x_marks"}
	walsender := func(perEvent time.Duration, events int) usage {
		return usage{sbSplit: pgSplit{cpu: map[pgClass]time.Duration{classWalsender: time.Duration(events) * perEvent}}}
	}
	s.originOn = rateResult{events: 10_000, took: time.Second, use: walsender(20*time.Microsecond, 10_000)}
	s.originOff = rateResult{events: 10_000, took: 2 * time.Second, use: walsender(40*time.Microsecond, 10_000)}
	s.originOffLat = latencyResult{events: 5000, use: walsender(120*time.Microsecond, 5000)}
	n = s.notes()
	for row, want := range map[string]string{
		"standby: the relay's walsender per event, backlog committed while streaming": "20.0 µs|40.0 µs|0.50",
		"standby: the relay's walsender per event, 1,000 ev/s":                        "90.0 µs|120.0 µs|0.75",
		"backlog committed while streaming (first commit → consumer has all)":         "10,000 ev/s|5,000 ev/s|2.00",
	} {
		if got := cells(n, row); len(got) != 4 || strings.Join(got[1:], "|") != want {
			t.Errorf("origin row %q: %v, want %s", row, got, want)
		}
	}
	if !strings.Contains(n, "cdcrelay_x_marks") || cells(n, "slot on the standby: 1,000 ev/s, MARK_ORIGIN=off") == nil {
		t.Errorf("origin notes:\n%s", n)
	}
}

func TestReportStandbyOnly(t *testing.T) {
	var out strings.Builder
	stdout = &out
	defer func() { stdout = os.Stdout }()
	res := &results{standby: standbyResult{notRun: "failed: slot creation timed out"}}
	opts := options{standbyOnly: true, strict: true}
	if code := report(res, opts, time.Now()); code != 0 {
		t.Errorf("a part that did not run exits %d with -strict, want 0 (not a missed target)", code)
	}
	got := out.String()
	if strings.Contains(got, "broker ceiling") || !strings.Contains(got, "THE STANDBY PART DID NOT RUN") ||
		!strings.HasSuffix(got, "standby part NOT RUN: failed: slot creation timed out\n") {
		t.Errorf("-standby-only report:\n%s", got)
	}
	out.Reset()
	res.standby = *standbyRun(9*time.Microsecond, 10*time.Microsecond)
	if code := report(res, opts, time.Now()); code != 3 {
		t.Errorf("missed standby targets with -strict: exit %d, want 3\n%s", code, out.String())
	}
}
