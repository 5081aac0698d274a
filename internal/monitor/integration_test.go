package monitor

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

const testInterval = 200 * time.Millisecond

// database starts a cluster with an "app" database holding the outbox of
// the migrations, and returns the superuser's connection and URL.
func database(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, pg.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	return db, pg.URL("app")
}

func exec(t *testing.T, db *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// running is a monitor run in the background with its own registry.
type running struct {
	*testenv.Background
	reg  *prometheus.Registry
	logs *testenv.Buffer
}

func start(t *testing.T, opts Options) *running {
	t.Helper()
	if opts.Interval == 0 {
		opts.Interval = testInterval
	}
	if opts.Slot == "" {
		opts.Slot = "s1"
	}
	logs := &testenv.Buffer{}
	reg := prometheus.NewPedanticRegistry()
	m := New(opts, slog.New(slog.NewTextHandler(logs, nil)), reg)
	r := &running{Background: testenv.Go(m.Run), reg: reg, logs: logs}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("monitor: %v", err)
		}
	})
	return r
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *running) series(t *testing.T) map[string]float64 { return exported(t, r.reg) }

// gaugesExported reports whether any of the holder-only gauges is exported.
func gaugesExported(series map[string]float64) bool {
	for k := range series {
		for _, n := range gaugeNames {
			if strings.HasPrefix(k, n+"{") {
				return true
			}
		}
	}
	return false
}

// TestIntegrationBacklogColumns: parked rows (last_error set) are counted
// apart and stay out of the count and the age; a table without last_error
// counts them as unpublished and reports 0 parked; without enqueued_at the
// age is NaN.
func TestIntegrationBacklogColumns(t *testing.T) {
	db, dbURL := database(t)
	cases := []struct {
		schema, drop         string
		unpublished, parked  float64
		oldestMin, oldestMax float64 // NaN: want NaN
	}{
		{"complete", "", 4, 2, 100, 200},
		{"no_last_error", "DROP COLUMN last_error", 6, 0, 1000, 1100},
		{"no_enqueued_at", "DROP COLUMN enqueued_at", 4, 2, math.NaN(), math.NaN()},
		{"neither", "DROP COLUMN enqueued_at, DROP COLUMN last_error", 6, 0, math.NaN(), math.NaN()},
	}
	for _, tc := range cases {
		exec(t, db, `CREATE SCHEMA `+tc.schema)
		exec(t, db, `CREATE TABLE `+tc.schema+`.outbox (LIKE public.event_outbox INCLUDING ALL)`)
		tbl := tc.schema + ".outbox"
		// 3 published, 4 unpublished (the oldest 100 s old), 2 parked
		// (older still: they must not set the age).
		exec(t, db, `INSERT INTO `+tbl+` (routing_key, payload, enqueued_at, published_at) SELECT 'k', '{}', now() - interval '2000 s', now() FROM generate_series(1, 3)`)
		exec(t, db, `INSERT INTO `+tbl+` (routing_key, payload, enqueued_at) SELECT 'k', '{}', now() - g * interval '25 s' FROM generate_series(1, 4) g`)
		exec(t, db, `INSERT INTO `+tbl+` (routing_key, payload, enqueued_at, attempts, last_error) SELECT 'k', '{}', now() - interval '1000 s', 1, 'poison' FROM generate_series(1, 2)`)
		if tc.drop != "" {
			exec(t, db, `ALTER TABLE `+tbl+` `+tc.drop)
		}
	}
	for _, tc := range cases {
		t.Run(tc.schema, func(t *testing.T) {
			r := start(t, Options{DatabaseURL: dbURL, Outbox: config.Outbox{Schema: tc.schema, Table: "outbox"}})
			var got map[string]float64
			waitFor(t, "the gauges", func() bool {
				got = r.series(t)
				_, ok := got["cdcrelay_outbox_unpublished{slot=s1}"]
				return ok
			})
			if u, p := got["cdcrelay_outbox_unpublished{slot=s1}"], got["cdcrelay_outbox_parked{slot=s1}"]; u != tc.unpublished || p != tc.parked {
				t.Errorf("unpublished %v parked %v, want %v %v", u, p, tc.unpublished, tc.parked)
			}
			age := got["cdcrelay_oldest_unpublished_age_seconds{slot=s1}"]
			if math.IsNaN(tc.oldestMin) != math.IsNaN(age) || (!math.IsNaN(age) && (age < tc.oldestMin || age >= tc.oldestMax)) {
				t.Errorf("oldest age %v, want in [%v, %v)", age, tc.oldestMin, tc.oldestMax)
			}
			// No slot: every status 0, nothing retained.
			if got["cdcrelay_slot_wal_status{slot=s1,status=reserved}"] != 0 || got["cdcrelay_slot_retained_wal_bytes{slot=s1}"] != 0 {
				t.Errorf("slot gauges without a slot: %v", got)
			}
			if n := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
				t.Errorf("%v monitor errors:\n%s", n, r.logs.String())
			}
		})
	}
}

// testutilCounter reads an unlabelled-but-for-slot counter.
func testutilCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mf := testenv.Family(t, reg, name)
	if mf == nil {
		t.Fatalf("no %s", name)
	}
	return mf.GetMetric()[0].GetCounter().GetValue()
}

// TestIntegrationBacklogQueryPlan: on an outbox of many published rows and
// a small backlog, the backlog statement reads the unpublished rows
// through the partial index of migrations/0001 and never scans the table.
func TestIntegrationBacklogQueryPlan(t *testing.T) {
	db, _ := database(t)
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'k', '{}', now() - g * interval '1 ms', now() FROM generate_series(1, 200000) g`)
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload) SELECT 'k', '{}' FROM generate_series(1, 500)`)
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload, last_error) SELECT 'k', '{}', 'poison' FROM generate_series(1, 20)`)
	exec(t, db, `VACUUM ANALYZE event_outbox`)
	sql := backlogSQL(backlogOnlySQL(`"public"."event_outbox"`, columns{enqueuedAt: true, lastError: true}, ""))
	var text []string
	rows, err := db.Query(context.Background(), `EXPLAIN (ANALYZE, BUFFERS) `+sql, "s1")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		text = append(text, l)
	}
	t.Logf("plan:\n%s", strings.Join(text, "\n"))
	scans := outboxScans(t, db, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, "s1")
	b, _ := json.Marshal(scans)
	if len(scans) == 0 {
		t.Fatal("the plan reads no event_outbox")
	}
	for _, s := range scans {
		if !strings.HasSuffix(s, " event_outbox_unpublished_idx") {
			t.Fatalf("event_outbox read by %s, want the partial index event_outbox_unpublished_idx only", b)
		}
	}
	t.Logf("event_outbox read by %s", b)
}

// outboxScans runs explain (an EXPLAIN … FORMAT JSON) and returns how the
// plan reads event_outbox: each scan's node type and index.
func outboxScans(t *testing.T, db *pgx.Conn, explain string, args ...any) []string {
	t.Helper()
	var plan []map[string]any
	if err := db.QueryRow(context.Background(), explain, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var scans []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); rel == "event_outbox" {
			idx, _ := n["Index Name"].(string)
			scans = append(scans, n["Node Type"].(string)+" "+idx)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	return scans
}

// backend is one monitor connection as pg_stat_activity shows it.
type backend struct {
	pid        int32
	query      string
	queryStart time.Time
}

func backends(t *testing.T, db *pgx.Conn, app string) []backend {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT pid, query, coalesce(query_start, 'epoch') FROM pg_stat_activity
		WHERE application_name = $1 AND backend_type = 'client backend' ORDER BY pid`, app)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (backend, error) {
		var b backend
		return b, r.Scan(&b.pid, &b.query, &b.queryStart)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lockHolder is the pid holding the monitor lock of slot s1, 0 if none.
func lockHolder(t *testing.T, db *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	err := db.QueryRow(context.Background(), `
		SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
		  AND classid = $1::bigint::oid AND objid = (hashtext('s1')::bigint & 4294967295)::oid`, pgconnect.MonitorLockClass).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func isHolder(t *testing.T, r *running) bool {
	t.Helper()
	got := r.series(t)
	return got["cdcrelay_monitor_holder{slot=s1}"] == 1 && gaugesExported(got)
}

func isBlind(t *testing.T, r *running) bool {
	t.Helper()
	got := r.series(t)
	return got["cdcrelay_monitor_holder{slot=s1}"] == 0 && !gaugesExported(got)
}

// TestIntegrationMonitorLock: of two monitors exactly one holds the lock
// and exports the gauges; the other keeps one connection that runs the
// try-lock once per interval and nothing else. A holder whose session is
// terminated while someone else takes the lock exports nothing any more;
// a monitor that stops closes its connection and the other takes over.
func TestIntegrationMonitorLock(t *testing.T) {
	db, dbURL := database(t)
	opts := func(app string) Options {
		return Options{DatabaseURL: testenv.WithApplicationName(t, dbURL, app), Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}}
	}
	a := start(t, opts("mon_a"))
	waitFor(t, "a to hold the lock and export", func() bool { return isHolder(t, a) })
	b := start(t, opts("mon_b"))

	// b tries again and again (query_start moves) with one statement.
	var first backend
	waitFor(t, "b's first try", func() bool {
		bs := backends(t, db, "mon_b")
		if len(bs) == 1 && strings.Contains(bs[0].query, "pg_try_advisory_lock") {
			first = bs[0]
			return true
		}
		return false
	})
	for tries := 0; tries < 3; {
		bs := backends(t, db, "mon_b")
		if len(bs) != 1 || bs[0].pid != first.pid || !strings.Contains(bs[0].query, "pg_try_advisory_lock") {
			t.Fatalf("the waiting monitor's backends %+v; want its one connection %d running the try-lock only", bs, first.pid)
		}
		if bs[0].queryStart.After(first.queryStart) {
			first = bs[0]
			tries++
		}
		if !isBlind(t, b) || !isHolder(t, a) {
			t.Fatalf("a %v, b %v: want a alone to hold and export", a.series(t), b.series(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := b.series(t); got["cdcrelay_monitor_last_success_timestamp_seconds{slot=s1}"] != 0 {
		t.Fatalf("b refreshed without the lock: %v", got)
	}

	// The holder's session ends and the test takes the lock: a finds out
	// at its next refresh and exports nothing any more; b still nothing.
	ctx := context.Background()
	thief, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the test to take the lock", func() bool {
		if pid := lockHolder(t, db); pid != 0 {
			exec(t, db, `SELECT pg_terminate_backend($1)`, pid)
		}
		var ok bool
		if err := thief.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext('s1'))`, pgconnect.MonitorLockClass).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	})
	waitFor(t, "a to stop exporting", func() bool { return isBlind(t, a) })
	if !isBlind(t, b) {
		t.Fatalf("b exports without the lock: %v", b.series(t))
	}
	if got := a.series(t); got["cdcrelay_monitor_last_success_timestamp_seconds{slot=s1}"] == 0 {
		t.Fatalf("a's last success is gone: %v", got)
	}

	// a stops, the test lets go: b takes over.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	// The backend ends once it has read the connection's Terminate.
	waitFor(t, "a's backend to end", func() bool { return len(backends(t, db, "mon_a")) == 0 })
	if err := thief.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to take over", func() bool { return isHolder(t, b) })

	// A stopping holder closes its connection: the next one takes over.
	c := start(t, opts("mon_c"))
	waitFor(t, "c to try", func() bool { return len(backends(t, db, "mon_c")) == 1 })
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	// The backend ends once it has read the connection's Terminate.
	waitFor(t, "b's backend to end", func() bool { return len(backends(t, db, "mon_b")) == 0 })
	waitFor(t, "c to take over", func() bool { return isHolder(t, c) })
	for _, name := range []string{"took the monitor lock", "released the monitor lock"} {
		if !strings.Contains(b.logs.String(), name) {
			t.Errorf("b did not log %q:\n%s", name, b.logs.String())
		}
	}
}

// TestIntegrationMonitorIgnoresIdleSessionTimeout: an idle_session_timeout
// on the role shorter than the interval ends neither the holder's session
// nor its lock: the same backend holds it turn after turn, without errors.
func TestIntegrationMonitorIgnoresIdleSessionTimeout(t *testing.T) {
	db, dbURL := database(t)
	r := startAsRoleWith(t, db, dbURL, "idle_session_timeout = '300ms'", "mon_idle")
	waitFor(t, "the monitor to hold the lock", func() bool { return isHolder(t, r) })
	holder := lockHolder(t, db)
	first := r.series(t)[lastSuccessKey]
	waitFor(t, "three more refreshes", func() bool { return r.series(t)[lastSuccessKey] >= first+3 })
	if now := lockHolder(t, db); now != holder || holder == 0 {
		t.Fatalf("monitor lock held by %d, then %d; want the same session throughout:\n%s", holder, now, r.logs.String())
	}
	if n := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
		t.Fatalf("%v monitor errors:\n%s", n, r.logs.String())
	}
}

const lastSuccessKey = "cdcrelay_monitor_last_success_timestamp_seconds{slot=s1}"

// startAsRoleWith starts a monitor (1 s interval) as a role "mon" that may
// read the outbox and has setting (`name = value`) as its role default.
func startAsRoleWith(t *testing.T, db *pgx.Conn, dbURL, setting, app string) *running {
	t.Helper()
	exec(t, db, `CREATE ROLE mon LOGIN PASSWORD 'mon-pw'; GRANT SELECT ON event_outbox TO mon; ALTER ROLE mon SET `+setting)
	u, err := url.Parse(testenv.WithApplicationName(t, dbURL, app))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("mon", "mon-pw")
	return start(t, Options{DatabaseURL: u.String(), Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}, Interval: time.Second})
}

// TestIntegrationMonitorIgnoresRoleStatementTimeout: a statement_timeout on
// the role shorter than the backlog query takes does not fail every
// refresh: the monitor bounds its statements itself.
func TestIntegrationMonitorIgnoresRoleStatementTimeout(t *testing.T) {
	db, dbURL := database(t)
	// A backlog the count takes more than the role's 1 ms to read.
	exec(t, db, `INSERT INTO event_outbox (routing_key, payload) SELECT 'k', '{}' FROM generate_series(1, 200000)`)
	r := startAsRoleWith(t, db, dbURL, "statement_timeout = '1ms'", "mon_timeout")
	waitFor(t, "the monitor to hold the lock", func() bool { return isHolder(t, r) })
	first := r.series(t)[lastSuccessKey]
	waitFor(t, "two more refreshes", func() bool { return r.series(t)[lastSuccessKey] >= first+2 })
	if n := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
		t.Fatalf("%v monitor errors:\n%s", n, r.logs.String())
	}
}

// TestIntegrationMonitorFailingHolderLetsGo: a holder whose refresh fails
// gives the monitor lock up, so another replica that can refresh takes it.
func TestIntegrationMonitorFailingHolderLetsGo(t *testing.T) {
	db, dbURL := database(t)
	// nosel may take the lock but not read the outbox.
	exec(t, db, `CREATE ROLE nosel LOGIN PASSWORD 'nosel-pw'`)
	u, err := url.Parse(testenv.WithApplicationName(t, dbURL, "mon_nosel"))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("nosel", "nosel-pw")
	failing := start(t, Options{DatabaseURL: u.String(), Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}, Interval: time.Second})
	waitFor(t, "the failing monitor's first error", func() bool {
		return testutilCounter(t, failing.reg, "cdcrelay_monitor_errors_total") > 0
	})
	healthy := start(t, Options{DatabaseURL: testenv.WithApplicationName(t, dbURL, "mon_ok"), Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}, Interval: time.Second})
	waitFor(t, "the healthy monitor to take the lock", func() bool { return isHolder(t, healthy) })
	if isHolder(t, failing) {
		t.Fatalf("both monitors report the lock:\n%s", failing.logs.String())
	}
}
