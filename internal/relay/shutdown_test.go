//go:build faults

package relay_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// shutdownEnv is newEnv with the relay, the exchange and the consumer on
// the broker at amqpURL (a private node the test may block).
func shutdownEnv(t *testing.T, amqpURL string) *env {
	t.Helper()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pg: pg, dbURL: pg.URL("app"), amqpURL: amqpURL, exchange: testenv.UniqueName("cdcrelay.shutdown")}
	e.db = e.connect()
	if err := migrations.Apply(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	e.relayURL = leastPrivilegeRole(t, e.db, e.dbURL)
	e.consumer = testenv.MustConsumer(t, amqpURL, e.exchange, testenv.UniqueName("cdcrelay.q"), "#")
	return e
}

// shutdownInsertLarge inserts n rows of about size bytes each, in
// transactions of ten, and returns them.
func shutdownInsertLarge(t *testing.T, e *env, n, size int) []row {
	t.Helper()
	ctx := context.Background()
	var rows []row
	for len(rows) < n {
		r, err := e.db.Query(ctx, `
			INSERT INTO event_outbox (routing_key, payload)
			SELECT 'large', jsonb_build_object('n', g, 'event_type', 'TestEvent',
				'pad', repeat(md5(g::text || clock_timestamp()::text), $2 / 32))
			FROM generate_series(1, $1) g
			RETURNING id::text, routing_key, payload::text`, min(10, n-len(rows)), size)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var rw row
			if err := r.Scan(&rw.id, &rw.key, &rw.payload); err != nil {
				t.Fatal(err)
			}
			rows = append(rows, rw)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return rows
}

// shutdownWaitExit waits for the process to end after a stop request and
// returns how long it took. If it is still running after within, it asks
// for a goroutine dump (SIGQUIT) and fails with the stacks that hold the
// broker connection.
func shutdownWaitExit(t *testing.T, p *testenv.Process, stopped time.Time, within time.Duration) time.Duration {
	t.Helper()
	for {
		if done, err := p.Exited(); done {
			if !isExit(err, 0) {
				t.Fatalf("relay exited with %v after the stop request", err)
			}
			return time.Since(stopped)
		}
		if time.Since(stopped) > within {
			_ = p.Cmd.Process.Signal(syscall.SIGQUIT)
			_ = p.Wait(t, 10*time.Second)
			var stuck []string
			for _, g := range strings.Split(p.Log.String(), "\n\n") {
				if strings.Contains(g, "amqp091-go") || strings.Contains(g, "coalesce") || strings.Contains(g, "publish.(*Publisher)") {
					stuck = append(stuck, g)
				}
			}
			t.Fatalf("relay still running %s after the stop request; its broker goroutines:\n%s", within, strings.Join(stuck, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationStopWhileBrokerBlocksAFullSocket (invariant 5, docs/architecture.md): the
// broker raises a memory alarm and stops reading the relay's connection
// while the in-flight window (128 MiB) holds more than the socket buffers
// can: a publish blocks in the socket write, holding amqp091-go's locks.
// SIGTERM must still end the relay within SHUTDOWN_TIMEOUT plus a few
// seconds (the relay closes its socket itself), and the janitor must flush
// the marks of the events acked before the block on the way out. Once the
// alarm clears, a new relay delivers everything.
func TestIntegrationStopWhileBrokerBlocksAFullSocket(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	const (
		shutdownTimeout = 3 * time.Second
		rowSize         = 320 << 10
		largeRows       = 200 // 62.5 MiB: far more than the client's and the broker's socket buffers
	)
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	// Registered after the node, so it runs before the node is stopped,
	// whatever happened to the test.
	t.Cleanup(func() {
		if err := rmq.SetMemoryHighWatermark(context.Background(), 0.4); err != nil {
			t.Logf("clear the memory alarm: %v", err)
		}
	})
	e := shutdownEnv(t, rmq.URL())
	addr := freeAddr(t)
	vars := map[string]string{
		"HTTP_ADDR": addr, "LOG_LEVEL": "info", "SHUTDOWN_TIMEOUT": shutdownTimeout.String(),
		"MAX_IN_FLIGHT_BYTES": "128MiB", "MAX_IN_FLIGHT": "1000",
		// Marks wait an hour, or for the exit: rows found marked after the
		// stop were marked by the janitor's flush on the way out.
		"MARK_INTERVAL": "1h",
	}
	p := e.startProcess(vars)
	waitReady(t, addr, "streaming", time.Minute)

	before, _ := insertTxns(t, e.db, "before", 10, 10)
	waitAll(t, e.consumer, before, 30*time.Second)
	shutdownWaitMetric(t, addr, "all confirmed", func(m map[string]float64) bool {
		return m["cdcrelay_events_published_total"] == float64(len(before)) && m["cdcrelay_confirms_in_flight"] == 0
	})
	if n := unmarked(t, e, before); n != len(before) {
		t.Fatalf("%d of %d rows marked before the stop; the test needs marks held until the exit", len(before)-n, len(before))
	}

	if err := rmq.SetMemoryHighWatermark(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	large := shutdownInsertLarge(t, e, largeRows, rowSize)
	// Blocked for good: the broker said so, and nothing more is published
	// for two seconds although events are left to publish.
	var stalled map[string]float64
	shutdownWaitMetric(t, addr, "the publisher to stall on the blocked broker", func(m map[string]float64) bool {
		if m[brokerBlockedSeries] != 1 || m["cdcrelay_events_published_total"] >= float64(len(before)+len(large)) {
			stalled = nil
			return false
		}
		if stalled == nil || stalled["cdcrelay_events_published_total"] != m["cdcrelay_events_published_total"] {
			stalled = m
			stalled["since"] = float64(time.Now().UnixNano())
			return false
		}
		return time.Since(time.Unix(0, int64(stalled["since"]))) > 2*time.Second
	})
	inFlight := stalled["cdcrelay_confirms_in_flight"]
	t.Logf("publisher stalled with %.0f events (%.0f MiB) unconfirmed, %.0f of %d published",
		inFlight, inFlight*rowSize/(1<<20), stalled["cdcrelay_events_published_total"], len(before)+len(large))

	stopped := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := shutdownWaitExit(t, p, stopped, shutdownTimeout+10*time.Second)
	t.Logf("relay exited %s after SIGTERM (SHUTDOWN_TIMEOUT %s) with the broker still blocking it", took.Round(10*time.Millisecond), shutdownTimeout)
	if n := unmarked(t, e, before); n != 0 {
		t.Fatalf("%d of %d rows acked before the block left unmarked: the janitor did not flush on exit", n, len(before))
	}

	if err := rmq.SetMemoryHighWatermark(context.Background(), 0.4); err != nil {
		t.Fatal(err)
	}
	vars["MARK_INTERVAL"] = "100ms"
	p2 := e.startProcess(vars)
	all := append(append([]row(nil), before...), large...)
	waitAll(t, e.consumer, all, 2*time.Minute)
	dups := report(t, all, e.consumer.Deliveries())
	waitMarked(t, e, large, 30*time.Second)
	restarted := time.Now()
	if err := p2.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the alarm cleared: all %d events delivered (%d duplicates) and marked; idle stop took %s",
		len(all), dups, shutdownWaitExit(t, p2, restarted, shutdownTimeout+10*time.Second).Round(10*time.Millisecond))
}

// shutdownWaitMetric polls the relay's /metrics until cond holds.
func shutdownWaitMetric(t *testing.T, addr, what string, cond func(map[string]float64) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		m := scrape(t, addr)
		if cond(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; metrics: %s", what, shutdownMetricSummary(m))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// brokerBlockedSeries is the scrape key of cdcrelay_broker_blocked, which
// carries the relay's slot.
const brokerBlockedSeries = `cdcrelay_broker_blocked{slot="` + slotName + `"}`

func shutdownMetricSummary(m map[string]float64) string {
	var out []string
	for _, k := range []string{brokerBlockedSeries, "cdcrelay_events_published_total", "cdcrelay_confirms_in_flight"} {
		out = append(out, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return strings.Join(out, " ")
}
