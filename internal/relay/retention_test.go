package relay_test

import (
	"context"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// retentionHistogram reads a histogram's sample count and sum.
func retentionHistogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	h := metricFamily(t, reg, name).GetMetric()[0].GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// retentionBackends counts the server's backends named application_name.
func retentionBackends(t *testing.T, db *pgx.Conn, name string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIntegrationRetentionDoesNotBlockMarking: while retention deletes
// 50,000 expired rows in batches of 20, events inserted one at a time are
// published and marked (the janitor used to run retention on its own
// goroutine and connection, so marking stopped for the whole run).
// Retention has a connection of its own, closed after the run.
func TestIntegrationRetentionDoesNotBlockMarking(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	const expired = 50000
	_, err := e.db.Exec(ctx, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at, published_at)
		SELECT 'old', jsonb_build_object('n', g, 'body', repeat('x', 120)), now() - interval '30 days' + g * interval '10 ms',
		       now() - interval '30 days' + g * interval '10 ms' + interval '1 second'
		FROM generate_series(1, $1::int) g`, expired)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `VACUUM ANALYZE event_outbox`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"RETENTION": "7d", "RETENTION_INTERVAL": "1s", "RETENTION_BATCH": "20", "MARK_INTERVAL": "20ms"})
	r.waitStreaming(t)
	deleted := func() float64 { return gauge(t, r.reg, "cdcrelay_janitor_deleted_total") }
	r.WaitFor(t, 60*time.Second, "retention started", func() bool { return deleted() > 0 })
	sawConn := false
	var during []time.Duration
	began := time.Now()
	for deleted() < expired {
		if time.Since(began) > 3*time.Minute {
			t.Fatalf("retention deleted only %v of %d rows in 3 min", deleted(), expired)
		}
		sawConn = sawConn || retentionBackends(t, e.db, "cdcrelay retention") == 1
		rows, _ := insertTxns(t, e.db, "live", 1)
		took := waitMarked(t, e, rows, 3*time.Minute)
		if deleted() < expired { // marked while retention was still deleting
			during = append(during, took)
		}
	}
	if len(during) == 0 {
		t.Fatalf("no event was marked while retention ran (it took %s)", time.Since(began).Round(time.Millisecond))
	}
	if !sawConn {
		t.Fatal("never saw retention's own connection (application_name 'cdcrelay retention') while it ran")
	}
	r.WaitFor(t, 30*time.Second, "retention's connection closed after the run", func() bool {
		return retentionBackends(t, e.db, "cdcrelay retention") == 0
	})
	sort.Slice(during, func(i, j int) bool { return during[i] < during[j] })
	t.Logf("retention of %d rows took about %s; %d events marked meanwhile, insert to marked p50 %s, max %s",
		expired, time.Since(began).Round(time.Millisecond), len(during), during[len(during)/2].Round(time.Millisecond), during[len(during)-1].Round(time.Millisecond))
}

// TestIntegrationAdoptionProgress: while an adoption publishes a backlog,
// cdcrelay_backfill_events_total advances (it used to be added only at
// the end) and the monitor reports the backlog (it used to run only while
// streaming); the backlog's hours-old rows stay out of the commit-to-ack
// histogram, which streamed events then feed as before.
func TestIntegrationAdoptionProgress(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	const backlog = 20000
	_, err := e.db.Exec(ctx, `
		INSERT INTO event_outbox (routing_key, payload, enqueued_at)
		SELECT 'backlog', jsonb_build_object('n', g, 'event_type', 'TestEvent'), now() - interval '3 hours'
		FROM generate_series(1, $1::int) g`, backlog)
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"MONITOR_INTERVAL": "100ms"})
	var progress, monitored bool
	var sample float64
	r.WaitFor(t, 3*time.Minute, "streaming after the adoption", func() bool {
		if gauge(t, r.reg, "cdcrelay_backfill_running") == 1 {
			n := gauge(t, r.reg, "cdcrelay_backfill_events_total")
			if n > 0 && n < backlog {
				progress, sample = true, n
			}
			v, exported := monitorValue(t, r.reg, "cdcrelay_outbox_unpublished")
			monitored = monitored || (exported && v > 0)
		}
		time.Sleep(10 * time.Millisecond)
		return r.relay.Streaming()
	})
	if !progress {
		t.Fatal("cdcrelay_backfill_events_total did not advance during the adoption")
	}
	if !monitored {
		t.Fatal("the monitor reported no backlog during the adoption")
	}
	if n := gauge(t, r.reg, "cdcrelay_backfill_events_total"); n != backlog {
		t.Fatalf("backfill counter %v after the adoption, want %d", n, backlog)
	}
	if n, sum := retentionHistogram(t, r.reg, "cdcrelay_commit_to_ack_seconds"); n != 0 {
		t.Fatalf("backfilled events in commit_to_ack: %d samples, %.0f s in all", n, sum)
	}
	rows, _ := insertTxns(t, e.db, "live", 1, 1, 1)
	testenv.WaitCount(t, e.consumer, backlog+len(rows), time.Minute)
	r.WaitFor(t, 30*time.Second, "streamed events in commit_to_ack", func() bool {
		n, _ := retentionHistogram(t, r.reg, "cdcrelay_commit_to_ack_seconds")
		return n == uint64(len(rows))
	})
	if _, sum := retentionHistogram(t, r.reg, "cdcrelay_commit_to_ack_seconds"); sum > 60 {
		t.Fatalf("commit_to_ack of %d streamed events sums to %.0f s", len(rows), sum)
	}
	t.Logf("backfill counter seen mid-adoption at %v of %d", sample, backlog)
}

// TestIntegrationMonitorWithoutEnqueuedAt: on a mapped table without
// enqueued_at the monitor still reports the backlog, exports the age as
// NaN, logs the degradation once and counts no errors; a later change of
// the id column's type does not break it.
func TestIntegrationMonitorWithoutEnqueuedAt(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox DROP COLUMN enqueued_at`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"MONITOR_INTERVAL": "100ms"})
	r.waitStreaming(t)
	// Unpublished rows the janitor cannot mark: the backlog the monitor counts.
	_, err := e.db.Exec(ctx, `
		CREATE FUNCTION keep_stuck() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.routing_key = 'stuck' THEN RETURN NULL; END IF; RETURN NEW; END $$;
		CREATE TRIGGER keep_stuck BEFORE UPDATE ON event_outbox FOR EACH ROW EXECUTE FUNCTION keep_stuck()`)
	if err != nil {
		t.Fatal(err)
	}
	insertTxns(t, e.db, "stuck", 3)
	r.WaitFor(t, 30*time.Second, "the backlog gauge at 3", func() bool { return monitorGauge(t, r.reg, "cdcrelay_outbox_unpublished") == 3 })
	if age := monitorGauge(t, r.reg, "cdcrelay_oldest_unpublished_age_seconds"); !math.IsNaN(age) {
		t.Fatalf("age gauge %v without enqueued_at, want NaN", age)
	}
	if _, err := e.db.Exec(ctx, `ALTER TABLE event_outbox ALTER COLUMN id TYPE text`); err != nil {
		t.Fatal(err)
	}
	insertTxns(t, e.db, "stuck", 2)
	r.WaitFor(t, 30*time.Second, "the backlog gauge at 5 after ALTER COLUMN id TYPE", func() bool {
		return monitorGauge(t, r.reg, "cdcrelay_outbox_unpublished") == 5
	})
	time.Sleep(500 * time.Millisecond) // a few more ticks
	if n := gauge(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
		t.Fatalf("%v monitor errors", n)
	}
	if n := strings.Count(r.logs.String(), "cdcrelay_oldest_unpublished_age_seconds is NaN"); n != 1 {
		t.Fatalf("the missing enqueued_at was logged %d times, want once:\n%s", n, r.logs)
	}
}
