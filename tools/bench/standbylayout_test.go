package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseStandbyLayout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want standbyLayout
	}{{"default", layoutDefault}, {"hot", layoutHOT}, {" HOT ", layoutHOT}} {
		if got, err := parseStandbyLayout(tt.in); err != nil || got != tt.want {
			t.Errorf("parseStandbyLayout(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "fast", "hot_marks", "default,hot"} {
		if got, err := parseStandbyLayout(in); err == nil || !strings.Contains(err.Error(), "want default") {
			t.Errorf("parseStandbyLayout(%q) = %q, %v; want an error naming the values", in, got, err)
		}
	}
	// hot only means something when the standby part runs.
	if _, err := standbyLayoutOption("hot", options{standby: false}); err == nil || !strings.Contains(err.Error(), "-standby=false") {
		t.Errorf("hot with -standby=false: %v, want an error", err)
	}
	for _, o := range []options{{standby: true}, {standbyOnly: true}} {
		if l, err := standbyLayoutOption("hot", o); err != nil || l != layoutHOT {
			t.Errorf("hot with %+v: %q, %v", o, l, err)
		}
	}
	if l, err := standbyLayoutOption("default", options{}); err != nil || l != layoutDefault {
		t.Errorf("default with -standby=false: %q, %v (the default must always parse)", l, err)
	}
}

func TestUpdateShare(t *testing.T) {
	for _, tt := range []struct {
		u    updateCounts
		want string
	}{
		{updateCounts{upd: 100_000, hot: 99_000}, "99.0%"},
		{updateCounts{upd: 20_000}, "0.0%"},
		{updateCounts{}, "n/a"},
		{updateCounts{upd: 800, hot: 400, short: true}, "50.0% (partial)"},
	} {
		if got := tt.u.share(); got != tt.want {
			t.Errorf("%+v: share %q, want %q", tt.u, got, tt.want)
		}
	}
	if d := (updateCounts{upd: 150, hot: 90}).minus(updateCounts{upd: 50, hot: 40}); d.upd != 100 || d.hot != 50 {
		t.Errorf("minus: %+v", d)
	}
}

// The layout the relay's phases ran on is named in the section's heading
// and on every target row, and the HOT share is reported per window.
func TestStandbyLayoutReport(t *testing.T) {
	us := time.Microsecond
	s := standbyRun(8*us, 10*us)
	rows := s.targetRows()
	if !strings.HasSuffix(rows[0][0], "default layout, draining") || !strings.Contains(s.notes(), "the relay's phases on the default layout:") {
		t.Errorf("no layout given reads as the default one: %q", rows[0][0])
	}
	s.layout = layoutHOT
	s.indexes = []string{"CREATE INDEX event_outbox_enqueued_idx ON event_outbox USING btree (enqueued_at)"}
	s.reloptions = "fillfactor=50"
	s.upd.drainer = updateCounts{upd: 1000}
	s.upd.standbyDrain = updateCounts{upd: 10_000, hot: 9_500}
	s.upd.standbyLat = updateCounts{upd: 4_000, hot: 4_000, short: true}
	rows = s.targetRows()
	for i, what := range []string{"HOT layout, draining", "HOT layout, 1,000 ev/s", "slot on a standby, HOT layout"} {
		if !strings.HasSuffix(rows[i][0], what) {
			t.Errorf("target row %d %q does not name the layout (%q)", i, rows[i][0], what)
		}
	}
	if missed := missedTargets(rows); len(missed) != 0 {
		t.Errorf("at the limit: missed %v", missed)
	}
	n := s.notes()
	if !strings.HasPrefix(n, "streaming from a standby (CDCRELAY_REPLICATION_URL), the relay's phases on the HOT layout:") {
		t.Errorf("heading:\n%s", firstLine(n))
	}
	if !strings.Contains(n, "fillfactor 50, indexes:\n    CREATE INDEX event_outbox_enqueued_idx") {
		t.Errorf("the layout's indexes are not listed:\n%s", n)
	}
	for row, want := range map[string]string{
		"polling drainer drain":           "1,000|1,000|0|0.0%",
		"slot on the standby: drain":      "10,000|10,000|9,500|95.0%",
		"slot on the standby: 1,000 ev/s": "5,000|4,000|4,000|100.0% (partial)",
		"slot on the primary: drain":      "10,000|0|0|n/a",
	} {
		// The split tables list the same windows first; the HOT table is
		// the one with five cells.
		var got []string
		for _, line := range strings.Split(n, "\n") {
			if c := cells(line, row); len(c) == 5 {
				got = c
			}
		}
		if len(got) != 5 || strings.Join(got[1:], "|") != want {
			t.Errorf("HOT row %q: %v, want %s", row, got, want)
		}
	}
	s.notRun = "failed: the HOT layout: boom"
	if r := s.targetRows(); !strings.HasSuffix(r[0][0], "HOT layout, draining") || r[0][1] != "NOT RUN" {
		t.Errorf("a part that did not run still names the layout asked for: %v", r[0])
	}
}

// The bench's own waits on the part's primary count rows by sequential or
// enqueued_at scans on the HOT layout: never on the relay's behalf.
func TestClassifyBenchWaits(t *testing.T) {
	for _, q := range []string{unmarkedSQL, markedBoundSQL, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'event_outbox'::regclass`} {
		be := pgBackend{pid: 30, backendType: "client backend", user: "postgres", database: benchDatabase, query: q}
		if got := classify(be, 31); got != classOther {
			t.Errorf("the bench's %q: %q, want %q", q, got, classOther)
		}
		be.app = "cdcrelay"
		if got := classify(be, 31); got == classOther {
			t.Errorf("the same statement from a relay connection is the relay's: %q", got)
		}
	}
}

// The monitor's statements: the list of the other relays' slots that ends
// each refresh, and on the HOT layout the bounded backlog scan and the
// reading of open transactions before it (internal/monitor/floor.go).
func TestClassifyMonitorHOT(t *testing.T) {
	for _, q := range []string{
		"\n\tSELECT s.slot_name::text\n\tFROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid\n\tWHERE s.slot_type = 'logical' AND s.plugin = 'pgoutput' AND s.database = current_database()\n\t  AND s.slot_name <> $1 AND a.application_name IN ($2, current_setting('application_name'))",
		"\n\tSELECT now() - interval '1 second', coalesce(array_agg(id), '{}')\n\tFROM (SELECT l.virtualxid::text AS id\n\t      FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid\n\t      WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted",
		"SELECT count(*) FILTER (WHERE last_error IS NULL) AS unpublished, (SELECT count(*) FROM \"public\".\"event_outbox\" WHERE last_error IS NOT NULL AND published_at IS NULL) AS parked FROM \"public\".\"event_outbox\" WHERE enqueued_at >= $1::timestamptz AND published_at IS NULL",
	} {
		if got := classify(pgBackend{pid: 40, backendType: "client backend", app: "cdcrelay", query: q}, 0); got != classMonitor {
			t.Errorf("%q: %q, want %q", q, got, classMonitor)
		}
	}
}
