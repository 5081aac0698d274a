package relay_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// monitorGauges are the gauges only the monitor lock's holder exports,
// and only while its last refresh is fresh.
var monitorGauges = []string{
	"cdcrelay_outbox_unpublished", "cdcrelay_outbox_parked", "cdcrelay_oldest_unpublished_age_seconds",
	"cdcrelay_slot_retained_wal_bytes", "cdcrelay_slot_lag_bytes", "cdcrelay_slot_safe_wal_size_bytes",
	"cdcrelay_slot_wal_status",
}

// monitorExports lists the holder-only gauges present in series (a
// scrape's or a registry's).
func monitorExports(series map[string]float64) []string {
	var out []string
	for k := range series {
		for _, n := range monitorGauges {
			if k == n || strings.HasPrefix(k, n+"{") {
				out = append(out, k)
			}
		}
	}
	return out
}

// registrySeries is scrape for an in-process relay's registry.
func registrySeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return testenv.Series(t, reg, labels)
}

// pollUntil polls cond every 50ms until it holds, failing after within
// (generous: it bounds a hang, not a speed).
func pollUntil(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not after %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

var (
	slotLabel   = `{slot="` + slotName + `"}`
	lastSuccess = "cdcrelay_monitor_last_success_timestamp_seconds" + slotLabel
	holderFlag  = "cdcrelay_monitor_holder" + slotLabel
)

// TestIntegrationMonitorDuringBrokerOutage: with the broker cut off nothing
// streams, yet the monitor keeps refreshing: its last success moves on,
// and the backlog and the WAL the slot retains grow with the inserts.
func TestIntegrationMonitorDuringBrokerOutage(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	r := e.startRelay(map[string]string{"MONITOR_INTERVAL": "300ms", "AMQP_URL": "amqp://guest:guest@" + proxy.Addr() + "/"})
	r.waitStreaming(t)
	// Marked, not just delivered: a confirm still on its way when the link
	// is cut leaves its row unpublished, and the backlog one row off.
	insertMarked(t, e, 5, 30*time.Second)

	proxy.Blackhole(true)
	proxy.Reset()
	r.WaitFor(t, 30*time.Second, "the relay to stop streaming", func() bool { return !r.relay.Streaming() })
	cut := float64(time.Now().UnixNano()) / 1e9
	var before map[string]float64
	pollUntil(t, 30*time.Second, "a refresh after the cut", func() bool {
		before = registrySeries(t, r.reg)
		return before[lastSuccess] > cut && len(monitorExports(before)) == len(monitorGauges)+3
	})
	rows, _ := insertTxns(t, e.db, "k", 200, 200)
	var after map[string]float64
	pollUntil(t, 30*time.Second, "the backlog and the retained WAL to grow while the broker is cut", func() bool {
		after = registrySeries(t, r.reg)
		return after["cdcrelay_outbox_unpublished"+slotLabel] == float64(len(rows)) &&
			after["cdcrelay_slot_retained_wal_bytes"+slotLabel] > before["cdcrelay_slot_retained_wal_bytes"+slotLabel] &&
			after[lastSuccess] > before[lastSuccess]
	})
	if after[holderFlag] != 1 || after["cdcrelay_oldest_unpublished_age_seconds"+slotLabel] <= 0 {
		t.Fatalf("holder %v, oldest age %v; want 1 and > 0", after[holderFlag], after["cdcrelay_oldest_unpublished_age_seconds"+slotLabel])
	}
	inserted := map[string]bool{}
	for _, rw := range rows {
		inserted[rw.id] = true
	}
	for _, d := range e.consumer.Deliveries() {
		if inserted[d.MessageID] {
			t.Fatalf("the broker was cut, yet %s was delivered", d.MessageID)
		}
	}
	t.Logf("broker cut, relay %s: retained WAL %v -> %v bytes, unpublished %v, last success moved %.1fs",
		r.relay.Role(), before["cdcrelay_slot_retained_wal_bytes"+slotLabel], after["cdcrelay_slot_retained_wal_bytes"+slotLabel],
		after["cdcrelay_outbox_unpublished"+slotLabel], after[lastSuccess]-before[lastSuccess])

	proxy.Blackhole(false)
	waitAll(t, e.consumer, rows, time.Minute)
	pollUntil(t, 30*time.Second, "the backlog gauge back at 0", func() bool {
		return registrySeries(t, r.reg)["cdcrelay_outbox_unpublished"+slotLabel] == 0
	})
}

// monitorLockHolder is the pid holding the monitor lock of the test slot,
// 0 if none.
func monitorLockHolder(t *testing.T, db *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	err := db.QueryRow(context.Background(), `
		SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = $1::bigint::oid AND objid = (hashtext($2)::bigint & 4294967295)::oid`, pgconnect.MonitorLockClass, slotName).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// monitorRole is what a relay process's /metrics says of the monitor: 1
// holder exporting every gauge, 0 exporting none of them; anything else
// fails the test.
func monitorRole(t *testing.T, addr string) (holder bool, series map[string]float64) {
	t.Helper()
	series = scrape(t, addr)
	got := monitorExports(series)
	switch {
	case series[holderFlag] == 1 && len(got) == len(monitorGauges)+3: // wal_status has four series
		return true, series
	case len(got) == 0:
		return false, series
	}
	if series[holderFlag] == 0 {
		t.Fatalf("%s: not the monitor lock's holder, yet exports %v", addr, got)
	}
	return false, series // a holder whose first refresh is still to come
}

// TestIntegrationMonitorOneHolder: of two relay processes exactly one holds
// the monitor lock and exports the gauges, the other none of them. SIGKILL
// the holder and the other takes over; a holder whose session is ended
// while someone else takes the lock exports none of them any more.
func TestIntegrationMonitorOneHolder(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	vars := func(addr, app string) map[string]string {
		return map[string]string{"HTTP_ADDR": addr, "DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, app), "MONITOR_INTERVAL": "500ms", "LOG_LEVEL": "info"}
	}
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := e.startProcess(vars(addrA, "mon_a"))
	waitReady(t, addrA, "streaming", 30*time.Second)
	pollUntil(t, 30*time.Second, "a to hold the monitor lock", func() bool { h, _ := monitorRole(t, addrA); return h })
	e.startProcess(vars(addrB, "mon_b"))
	waitReady(t, addrB, "standby", 30*time.Second)
	insertDelivered(t, e, 5)
	// b has tried the lock a few times (its backend's query_start moves on).
	var tried time.Time
	for tries := 0; tries < 3; time.Sleep(50 * time.Millisecond) {
		if hA, _ := monitorRole(t, addrA); !hA {
			t.Fatal("a lost the monitor lock")
		}
		hB, sB := monitorRole(t, addrB)
		if hB || sB[holderFlag] != 0 || sB[lastSuccess] != 0 {
			t.Fatalf("b exports %v while a holds the monitor lock", sB)
		}
		for _, bk := range slotownBackends(t, e.db, "mon_b") {
			if bk.database == "app" && strings.Contains(bk.query, "pg_try_advisory_lock") && bk.queryStart != nil && bk.queryStart.After(tried) {
				tried = *bk.queryStart
				tries++
			}
		}
	}

	// SIGKILL the holder: its backends end with it, b takes over.
	if err := a.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := pollUntil(t, 30*time.Second, "b to take over the monitor", func() bool { h, _ := monitorRole(t, addrB); return h })
	t.Logf("monitor taken over %s after the holder's SIGKILL (interval 500ms)", took.Round(time.Millisecond))
	waitReady(t, addrB, "streaming", 30*time.Second)

	// c waits; the test ends b's monitor session and takes the lock: b
	// exports nothing any more, and c nothing either.
	addrC := freeAddr(t)
	e.startProcess(vars(addrC, "mon_c"))
	waitReady(t, addrC, "standby", 30*time.Second)
	ctx := context.Background()
	thief := e.connect()
	pollUntil(t, 30*time.Second, "the test to take the monitor lock", func() bool {
		if pid := monitorLockHolder(t, e.db); pid != 0 {
			if _, err := e.db.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
		}
		var ok bool
		if err := thief.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, pgconnect.MonitorLockClass, slotName).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	})
	pollUntil(t, 30*time.Second, "b to stop exporting", func() bool {
		_, s := monitorRole(t, addrB)
		return s[holderFlag] == 0 && len(monitorExports(s)) == 0
	})
	for name, addr := range map[string]string{"b": addrB, "c": addrC} {
		if h, s := monitorRole(t, addr); h || len(monitorExports(s)) != 0 {
			t.Fatalf("%s exports %v while the test holds the monitor lock", name, monitorExports(s))
		}
	}
	if ts := scrape(t, addrB)[lastSuccess]; ts < 1e9 {
		t.Fatalf("b's last success is gone: %v", ts)
	}

	// The test lets go: exactly one of b and c takes over.
	if _, err := thief.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "b or c to take over", func() bool {
		hB, _ := monitorRole(t, addrB)
		hC, _ := monitorRole(t, addrC)
		if hB && hC {
			t.Fatal("b and c both export the gauges")
		}
		return hB || hC
	})
}

// TestIntegrationMonitorParkedRows: a parked poison row is counted in
// cdcrelay_outbox_parked and stays out of the unpublished count and the
// oldest age.
func TestIntegrationMonitorParkedRows(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "p.#")
	poisonTable(t, e)
	r := e.startRelay(map[string]string{"MONITOR_INTERVAL": "300ms"})
	r.waitStreaming(t)
	ctx := context.Background()
	var bad string
	if err := e.db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('p.bad', 'not json') RETURNING id::text`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	good, _ := insertTxns(t, e.db, "p.good", 3)
	waitAll(t, e.consumer, good, 30*time.Second)
	waitMarked(t, e, good, 30*time.Second)
	pollUntil(t, 30*time.Second, "the poison row to be parked", func() bool {
		var parked bool
		if err := e.db.QueryRow(ctx, `SELECT last_error IS NOT NULL AND published_at IS NULL FROM event_outbox WHERE id = $1`, bad).Scan(&parked); err != nil {
			t.Fatal(err)
		}
		return parked
	})
	var s map[string]float64
	pollUntil(t, 30*time.Second, "parked 1, unpublished 0, oldest 0", func() bool {
		s = registrySeries(t, r.reg)
		p, okP := s["cdcrelay_outbox_parked"+slotLabel]
		u, okU := s["cdcrelay_outbox_unpublished"+slotLabel]
		o, okO := s["cdcrelay_oldest_unpublished_age_seconds"+slotLabel]
		return okP && okU && okO && p == 1 && u == 0 && o == 0
	})
	t.Logf("gauges with the poison row parked: %v", monitorSubset(s))
}

func monitorSubset(s map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, k := range monitorExports(s) {
		out[k] = s[k]
	}
	return out
}

// monitorValue reads an in-process relay's monitor gauge (the first series
// of name) and whether it is exported now: it is not before the first
// refresh, nor while the monitor is not fresh.
func monitorValue(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mf := testenv.Family(t, reg, name)
	if mf == nil {
		return 0, false
	}
	return mf.GetMetric()[0].GetGauge().GetValue(), true
}

// monitorGauge waits (30 s at most) until the relay exports the monitor
// gauge name and returns its value.
func monitorGauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	var v float64
	pollUntil(t, 30*time.Second, name+" exported", func() bool {
		var ok bool
		v, ok = monitorValue(t, reg, name)
		return ok
	})
	return v
}
