//go:build faults

package relay_test

// The standby's idle window (60 s of waiting) runs in the fault suite, make
// test-faults, not in make test: see main_test.go.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// slotownDBStats reads the database's session and transaction counters.
func slotownDBStats(t *testing.T, db *pgx.Conn, database string) (sessions, xacts int64) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	err := db.QueryRow(context.Background(), `SELECT sessions, xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, database).Scan(&sessions, &xacts)
	if err != nil {
		t.Fatal(err)
	}
	return sessions, xacts
}

// TestIntegrationStandbyZeroPolling: two relays on one slot, idle for 60 s.
// PostgreSQL's own statistics show the standby ran no statement and opened
// no connection meanwhile: its backends keep their pids and query_start,
// and neither the service database nor the lock's database counts a new
// session or a transaction. The standby holds back no vacuum horizon in
// the service database (its waiting statement runs in the lock's).
func TestIntegrationStandbyZeroPolling(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"autovacuum": "off"}}, "#")
	if err := e.pg.CreateDatabase(context.Background(), "slotown_stats"); err != nil {
		t.Fatal(err)
	}
	stats, err := pgx.Connect(context.Background(), e.pg.URL("slotown_stats"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stats.Close(context.Background()) })
	quiet := map[string]string{"MONITOR_INTERVAL": "1h"}
	a := e.startRelay(map[string]string{"DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_a"), "MONITOR_INTERVAL": "1h"})
	a.waitStreaming(t)
	quiet["DATABASE_URL"] = testenv.WithApplicationName(t, e.relayURL, "slotown_b")
	b := e.startRelay(quiet)
	b.WaitFor(t, 30*time.Second, "standby", func() bool { return b.relay.Role() == relay.RoleStandby })
	slotownWaitingOnLock(t, stats, "slotown_b", 10*time.Second)
	// The streaming relay's retention makes its first run 10-30 s after it
	// starts streaming (then hourly): let it finish, so that the window
	// below sees only what the standby does.
	a.WaitFor(t, 45*time.Second, "the first retention run", func() bool {
		return gauge(t, a.reg, "cdcrelay_retention_runs_total") >= 1
	})
	// PostgreSQL 15 flushes a backend's counters up to 10 s after its last
	// statement: let the start-up statements land before the window opens.
	time.Sleep(11 * time.Second)

	before := slotownBackends(t, stats, "slotown_b")
	for _, bk := range before {
		if bk.database == "app" && bk.xmin != "" {
			t.Fatalf("the standby holds back the service database's vacuum horizon: %v", bk)
		}
	}
	sessions0, xacts0 := slotownDBStats(t, stats, "app")
	lockSessions0, lockXacts0 := slotownDBStats(t, stats, "postgres")
	const window = 60 * time.Second
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(5 * time.Second) {
		if now := slotownBackends(t, stats, "slotown_b"); fmt.Sprint(now) != fmt.Sprint(before) {
			t.Fatalf("the standby's backends changed while idle:\nbefore %v\nnow    %v", before, now)
		}
	}
	after := slotownBackends(t, stats, "slotown_b")
	sessions1, xacts1 := slotownDBStats(t, stats, "app")
	lockSessions1, lockXacts1 := slotownDBStats(t, stats, "postgres")
	t.Logf("standby idle %s: backends %d (%v); service database: %d new sessions, %d transactions; lock database: %d new sessions, %d transactions",
		window, len(after), after, sessions1-sessions0, xacts1-xacts0, lockSessions1-lockSessions0, lockXacts1-lockXacts0)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the standby's backends changed while idle:\nbefore %v\nafter  %v", before, after)
	}
	if sessions1 != sessions0 || xacts1 != xacts0 || lockSessions1 != lockSessions0 || lockXacts1 != lockXacts0 {
		t.Fatalf("while both relays were idle the databases counted %d+%d new sessions and %d+%d transactions, want 0",
			sessions1-sessions0, lockSessions1-lockSessions0, xacts1-xacts0, lockXacts1-lockXacts0)
	}
	aHeld, bHeld := gauge(t, a.reg, "cdcrelay_slot_lock_held"), gauge(t, b.reg, "cdcrelay_slot_lock_held")
	if b.relay.Role() != relay.RoleStandby || !a.relay.Streaming() || bHeld != 0 || aHeld != 1 {
		t.Fatalf("roles after the window: a %s (slot lock held %v), b %s (slot lock held %v)", a.relay.Role(), aHeld, b.relay.Role(), bHeld)
	}
	// The wait is real: the standby takes over once the holder stops.
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	b.waitStreaming(t)
	insertDelivered(t, e, 3)
}
