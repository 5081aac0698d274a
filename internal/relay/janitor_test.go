package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// unmarked counts rows among ids with published_at IS NULL.
func unmarked(t *testing.T, e *env, rows []row) int {
	t.Helper()
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	var n int
	err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE id = ANY($1::uuid[]) AND published_at IS NULL`, ids).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitMarked(t *testing.T, e *env, rows []row, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for unmarked(t, e, rows) > 0 {
		if time.Since(start) > within {
			t.Fatalf("%d of %d rows still unmarked after %s", unmarked(t, e, rows), len(rows), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// metricFamily gathers reg and returns the metric family named name,
// failing the test if the registry has none.
func metricFamily(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	mf := testenv.Family(t, reg, name)
	if mf == nil {
		t.Fatalf("no metric %s", name)
	}
	return mf
}

// gauge reads an unlabelled gauge or counter; it fails the test if the
// registry has no such metric.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return testenv.Value(metricFamily(t, reg, name).GetMetric()[0])
}

// waitCounter waits until the relay's metric name reaches at least want,
// failing after within: the evidence a "nothing happened" check needs
// that the relay ran through its window, not only that the test's clock
// moved (on a loaded machine the relay may have run none of it).
func waitCounter(t *testing.T, reg *prometheus.Registry, name string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for gauge(t, reg, name) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s at %v after %s, want at least %v", name, gauge(t, reg, name), within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusesFast is the STATUS_INTERVAL of the tests that count the relay's
// standby status updates as its clock: an idle relay sends one per
// interval, so n more updates mean the relay ran at least (n-1) intervals.
const statusesFast = 100 * time.Millisecond

// liveFor waits until the relay has sent enough standby status updates
// (STATUS_INTERVAL statusesFast) to have run through d since the call,
// and d has passed.
func liveFor(t *testing.T, r *running, d time.Duration) {
	t.Helper()
	const name = "cdcrelay_status_updates_total"
	start := time.Now()
	waitCounter(t, r.reg, name, gauge(t, r.reg, name)+float64(d/statusesFast)+1, d+time.Minute)
	time.Sleep(d - time.Since(start)) // an update the server asked for comes early
}

// counter reads one labelled series of a metric vector.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	for _, m := range metricFamily(t, reg, name).GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// TestIntegrationJanitorMarksInBatches: acked events get published_at
// within about a second, with one UPDATE per batch, never per row.
func TestIntegrationJanitorMarksInBatches(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"MARK_BATCH": "500", "MONITOR_INTERVAL": "200ms"})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "k", 500, 500, 500, 500, 1000)
	waitAll(t, e.consumer, rows, time.Minute)
	took := waitMarked(t, e, rows, 10*time.Second)
	t.Logf("all %d rows marked %s after the last delivery", len(rows), took)

	var calls int64
	err := e.db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%UPDATE%published_at = now()%'`).Scan(&calls)
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || calls > int64(len(rows))/100 {
		t.Fatalf("%d marking statements for %d rows: not batched", calls, len(rows))
	}
	updated := int64(gauge(t, r.reg, "cdcrelay_janitor_marked_total"))
	if updated != int64(len(rows)) {
		t.Fatalf("marked %d rows, want %d", updated, len(rows))
	}
	t.Logf("%d rows marked by %d UPDATE statements", updated, calls)

	deadline := time.Now().Add(5 * time.Second)
	for monitorGauge(t, r.reg, "cdcrelay_outbox_unpublished") != 0 || gauge(t, r.reg, "cdcrelay_janitor_marked_total") != float64(len(rows)) {
		if time.Now().After(deadline) {
			t.Fatalf("unpublished gauge %v, marked %v", monitorGauge(t, r.reg, "cdcrelay_outbox_unpublished"), gauge(t, r.reg, "cdcrelay_janitor_marked_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationJanitorIdleRunsNothing: the janitor's ticker fires every
// MARK_INTERVAL, but with nothing acked it runs no statement, so a short
// interval is no polling load on the primary.
func TestIntegrationJanitorIdleRunsNothing(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "20ms", "STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "k", 10)
	waitAll(t, e.consumer, rows, time.Minute)
	waitMarked(t, e, rows, 10*time.Second)

	janitorCalls := func() int64 {
		var n int64
		err := e.db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
			WHERE query LIKE '%published_at = now()%' OR query LIKE '%attempts = attempts + 1%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := janitorCalls()
	if before == 0 {
		t.Fatal("pg_stat_statements saw no marking statement: the filter no longer matches the janitor's SQL")
	}
	liveFor(t, r, time.Second) // 50 ticks of the mark interval
	if after := janitorCalls(); after != before {
		t.Fatalf("janitor ran %d statements in 1 s with nothing to mark", after-before)
	}
}

// TestIntegrationJanitorNeverMarksUnacked holds confirms back: the rows
// reach the queue but stay unmarked until the relay has the acks.
func TestIntegrationJanitorNeverMarksUnacked(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	r := e.startRelay(map[string]string{"AMQP_URL": "amqp://guest:guest@" + proxy.Addr() + "/", "AMQP_HEARTBEAT": "30s", "MONITOR_INTERVAL": "100ms",
		"STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	proxy.HoldDownstream(true)
	rows, _ := insertTxns(t, e.db, "k", 50)
	testenv.WaitCount(t, e.consumer, len(rows), 30*time.Second)
	liveFor(t, r, 1500*time.Millisecond) // three mark intervals
	if n := unmarked(t, e, rows); n != len(rows) {
		t.Fatalf("%d rows marked published before the broker confirmed them", len(rows)-n)
	}
	if g := monitorGauge(t, r.reg, "cdcrelay_outbox_unpublished"); g != float64(len(rows)) {
		t.Fatalf("unpublished gauge %v, want %d", g, len(rows))
	}
	proxy.HoldDownstream(false)
	waitMarked(t, e, rows, 10*time.Second)
}

// TestIntegrationJanitorFailuresDoNotStopStreaming: marking fails (a
// trigger refuses it) while events keep flowing; once it works again the
// rows are marked.
func TestIntegrationJanitorFailuresDoNotStopStreaming(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	_, err := e.db.Exec(ctx, `
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'marking refused by test'; END $$;
		CREATE TRIGGER refuse BEFORE UPDATE ON event_outbox FOR EACH ROW EXECUTE FUNCTION refuse()`)
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "100ms"})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "k", 10, 10)
	waitAll(t, e.consumer, rows, 30*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for gauge(t, r.reg, "cdcrelay_janitor_errors_total") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("janitor errors not counted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	more, _ := insertTxns(t, e.db, "k", 5)
	waitAll(t, e.consumer, more, 30*time.Second)
	if n := unmarked(t, e, append(rows, more...)); n != len(rows)+len(more) {
		t.Fatalf("%d rows marked through a refusing trigger", len(rows)+len(more)-n)
	}
	if _, err := e.db.Exec(ctx, `DROP TRIGGER refuse ON event_outbox`); err != nil {
		t.Fatal(err)
	}
	waitMarked(t, e, append(rows, more...), 10*time.Second)
}

// TestIntegrationRetention deletes old published rows in batches and never
// an unpublished one, however old.
func TestIntegrationRetention(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	_, err := e.db.Exec(ctx, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'old', '{}', now() - interval '30 days', now() - interval '8 days' FROM generate_series(1, 2500);
		INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'recent', '{}', now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 100);`)
	if err != nil {
		t.Fatal(err)
	}
	// Unpublished and old: the relay publishes these from the new slot's
	// snapshot, but a trigger keeps them from being marked, so they stay
	// unpublished while retention runs.
	_, err = e.db.Exec(ctx, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at) SELECT 'stuck', '{}', now() - interval '60 days' FROM generate_series(1, 10);
		CREATE FUNCTION keep_stuck() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.routing_key = 'stuck' THEN RETURN NULL; END IF; RETURN NEW; END $$;
		CREATE TRIGGER keep_stuck BEFORE UPDATE ON event_outbox FOR EACH ROW EXECUTE FUNCTION keep_stuck()`)
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"RETENTION": "7d", "RETENTION_INTERVAL": "200ms", "RETENTION_BATCH": "1000"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		var old, recent, stuck int
		err := e.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE routing_key = 'old'), count(*) FILTER (WHERE routing_key = 'recent'),
			count(*) FILTER (WHERE routing_key = 'stuck' AND published_at IS NULL) FROM event_outbox`).Scan(&old, &recent, &stuck)
		if err != nil {
			t.Fatal(err)
		}
		if stuck != 10 || recent != 100 {
			t.Fatalf("retention deleted rows it must keep: %d of 10 unpublished, %d of 100 recent left", stuck, recent)
		}
		if old == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d old published rows left after 20s", old)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := gauge(t, r.reg, "cdcrelay_janitor_deleted_total"); n != 2500 {
		t.Fatalf("deleted counter %v, want 2500", n)
	}
	if testenv.WaitCount(t, e.consumer, 10, 10*time.Second); e.consumer.Count() != 10 {
		t.Fatalf("%d deliveries, want the 10 unpublished rows", e.consumer.Count())
	}
}

// holdCommits sets synchronous_standby_names to a name no standby has, so
// every commit waits, as a stopped synchronous standby makes it: the rows
// are in the WAL (the relay decodes them) but not visible to other
// sessions. release (also run when the test ends) lets the commits return.
func holdCommits(t *testing.T, e *env) (release func()) {
	t.Helper()
	set := func(names string) {
		t.Helper()
		ctx := context.Background()
		if _, err := e.db.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}
	set("stopped_standby")
	release = func() { t.Helper(); set("") }
	t.Cleanup(release)
	return release
}

// requireNoRowVisible fails the test if another session sees any outbox
// row: a test of rows seen late proves nothing once they are visible.
func requireNoRowVisible(t *testing.T, e *env) {
	t.Helper()
	var visible int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox`).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("row visible (%d, %v) before its commit returned; the test would prove nothing", visible, err)
	}
}

// TestIntegrationSyncStandbyStalledRowsNeverGone: commits held by a
// synchronous standby that does not answer for longer than the old 10 s
// grace (synchronous_standby_names names a standby that is not there, the
// state a stopped standby leaves): the rows are delivered at once but not
// visible to other sessions; the janitor asks PostgreSQL whether their
// transactions are visible yet and waits, so none is counted gone, and
// every row ends marked once the commits return. The old janitor counted
// them gone after 10 s, and the slot passed rows never marked.
func TestIntegrationSyncStandbyStalledRowsNeverGone(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	ctx := context.Background()
	release := holdCommits(t, e)
	const n = 20
	inserted := make(chan error, n)
	for range n {
		db := e.connect()
		go func() {
			_, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('held', '{"event_type":"TestEvent"}')`)
			inserted <- err
		}()
	}
	testenv.WaitCount(t, e.consumer, n, 30*time.Second) // decoded and published while the commits wait
	liveFor(t, r, 12*time.Second)                       // longer than the old janitor's grace
	if got := gauge(t, r.reg, "cdcrelay_janitor_rows_gone_total"); got != 0 {
		t.Fatalf("%v rows counted gone while their commits waited for the standby", got)
	}
	release()
	for range n {
		if err := <-inserted; err != nil {
			t.Fatal(err)
		}
	}
	var rows []row
	for _, d := range e.consumer.Deliveries() {
		rows = append(rows, row{id: d.MessageID})
	}
	waitMarked(t, e, rows, 10*time.Second)
	if got := gauge(t, r.reg, "cdcrelay_janitor_rows_gone_total"); got != 0 {
		t.Fatalf("%v rows counted gone", got)
	}
}

// TestIntegrationJanitorMarksRowsSeenLate: the relay can receive and
// publish a transaction before its rows are visible to other sessions
// (here: a commit held back by synchronous replication). The janitor's
// first attempt cannot see the row; it must try again and mark it once the
// row is visible, not forget it.
func TestIntegrationJanitorMarksRowsSeenLate(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	ctx := context.Background()
	release := holdCommits(t, e)
	db := e.connect()
	inserted := make(chan error, 1)
	go func() {
		_, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('late', '{"event_type":"TestEvent"}')`)
		inserted <- err
	}()
	testenv.WaitCount(t, e.consumer, 1, 30*time.Second) // decoded and published while the commit still waits
	requireNoRowVisible(t, e)
	liveFor(t, r, time.Second) // several marking attempts that cannot see the row
	release()
	if err := <-inserted; err != nil {
		t.Fatal(err)
	}
	id := e.consumer.Deliveries()[0].MessageID
	waitMarked(t, e, []row{{id: id}}, 10*time.Second)
}

// TestIntegrationJanitorParksRowsSeenLate: as above for a poison row. The
// relay parks it at once, with no broker round trip, so the janitor's
// UPDATE can run before the row's transaction is visible (here: a commit
// held back by synchronous replication; on a loaded machine: the gap
// between the commit's WAL flush and its visibility). The janitor must
// try again until the row is visible, not count the park as recorded and
// let the slot pass a row that is neither published nor parked.
func TestIntegrationJanitorParksRowsSeenLate(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	poisonTable(t, e)
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	ctx := context.Background()
	release := holdCommits(t, e)
	db := e.connect()
	inserted := make(chan error, 1)
	var id string
	go func() {
		inserted <- db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('late', 'not json') RETURNING id::text`).Scan(&id)
	}()
	r.WaitFor(t, 30*time.Second, "the poison event decoded and parked while its commit still waits", func() bool {
		return gauge(t, r.reg, "cdcrelay_poison_events_total") >= 1
	})
	requireNoRowVisible(t, e)
	liveFor(t, r, time.Second) // several attempts to record the park that cannot see the row
	release()
	if err := <-inserted; err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "the poison row parked once visible", func() bool {
		var parked bool
		if err := e.db.QueryRow(ctx, `SELECT last_error IS NOT NULL AND published_at IS NULL FROM event_outbox WHERE id = $1`, id).Scan(&parked); err != nil {
			t.Fatal(err)
		}
		return parked
	})
}
