//go:build pgmatrix

package monitor

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// This file needs PostgreSQL 16 or later (logical decoding on a standby):
// build tag pgmatrix, so that make test (Debian's 15) leaves it out; run it
// with CDCRELAY_PG_BIN pointing at newer binaries, as make test-pg-matrix
// does.

func connectTo(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	return db
}

// createSlotOnStandby creates the logical slot on the standby. Its creation
// waits for a running-xacts record from the primary, which an idle primary
// writes rarely: the primary logs one every 500 ms until the slot exists.
func createSlotOnStandby(ctx context.Context, t *testing.T, primary, standby *pgx.Conn, name string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := standby.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name)
		done <- err
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := primary.Exec(ctx, `SELECT pg_log_standby_snapshot()`); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("create slot %s on the standby: %v", name, err)
			}
			return
		case <-tick.C:
		}
	}
}

// slotOnStandby is a primary with the outbox and a standby holding the
// logical slot s1, both of database app.
type slotOnStandby struct {
	primary, standby     *testenv.Postgres
	primaryDB, standbyDB *pgx.Conn // the test's connections
}

func setUpSlotOnStandby(ctx context.Context, t *testing.T) *slotOnStandby {
	t.Helper()
	primary := testenv.MustPostgres(t, testenv.PostgresOptions{})
	if err := primary.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	setup, err := pgx.Connect(ctx, primary.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, setup); err != nil {
		t.Fatal(err)
	}
	_ = setup.Close(ctx)
	// MustStandby restarts the primary: connect to it afterwards.
	standby := testenv.MustStandby(t, primary, testenv.StandbyOptions{})
	e := &slotOnStandby{primary: primary, standby: standby,
		primaryDB: connectTo(ctx, t, primary.URL("app")), standbyDB: connectTo(ctx, t, standby.URL("app"))}
	createSlotOnStandby(ctx, t, e.primaryDB, e.standbyDB, "s1")
	return e
}

// replayed waits until the standby has replayed everything the primary
// committed so far, and returns that position.
func (e *slotOnStandby) replayed(ctx context.Context, t *testing.T) pglogrepl.LSN {
	t.Helper()
	lsn, err := e.primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// confirmedFlush is the slot's confirmed_flush_lsn on the standby.
func (e *slotOnStandby) confirmedFlush(ctx context.Context, t *testing.T) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	if err := e.standbyDB.QueryRow(ctx, `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 's1'`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestIntegrationMonitorSlotOnStandby: with SlotDatabaseURL on a standby
// holding the slot, the backlog gauges come from the primary and the slot's
// from the standby (the primary has no such slot), the lock stays on the
// primary; losing either connection fails the refresh, which closes both and
// gives the lock up, and the monitor recovers.
func TestIntegrationMonitorSlotOnStandby(t *testing.T) {
	testenv.RequireMajor(t, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := setUpSlotOnStandby(ctx, t)
	exec(t, e.primaryDB, `INSERT INTO event_outbox (routing_key, payload, published_at) SELECT 'k', '{}', now() FROM generate_series(1, 3)`)
	exec(t, e.primaryDB, `INSERT INTO event_outbox (routing_key, payload) SELECT 'k', '{}' FROM generate_series(1, 5)`)
	exec(t, e.primaryDB, `INSERT INTO event_outbox (routing_key, payload, last_error) SELECT 'k', '{}', 'poison' FROM generate_series(1, 2)`)
	replayed := e.replayed(ctx, t)
	confirmed := e.confirmedFlush(ctx, t)
	if replayed <= confirmed {
		t.Fatalf("replayed %s, slot confirmed %s: the inserts should put the slot behind", replayed, confirmed)
	}

	const app = "mon_standby"
	r := start(t, Options{
		DatabaseURL:     testenv.WithApplicationName(t, e.primary.URL("app"), app),
		SlotDatabaseURL: testenv.WithApplicationName(t, e.standby.URL("app"), app),
		Outbox:          config.Outbox{Schema: "public", Table: "event_outbox"},
	})
	waitFor(t, "the monitor to hold the lock and export", func() bool { return isHolder(t, r) })
	got := r.series(t)
	after, err := e.primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u, p := got["cdcrelay_outbox_unpublished{slot=s1}"], got["cdcrelay_outbox_parked{slot=s1}"]; u != 5 || p != 2 {
		t.Errorf("unpublished %v parked %v, want 5 2 (the primary's outbox)", u, p)
	}
	if got["cdcrelay_slot_wal_status{slot=s1,status=reserved}"] != 1 {
		t.Errorf("wal_status not reserved: %v", got)
	}
	// The standby's replay position is at least what it had replayed before
	// and at most the primary's position now.
	lag, retained := got["cdcrelay_slot_lag_bytes{slot=s1}"], got["cdcrelay_slot_retained_wal_bytes{slot=s1}"]
	if lo, hi := float64(replayed-confirmed), float64(after-confirmed); lag < lo || lag > hi {
		t.Errorf("lag %v, want in [%v, %v]", lag, lo, hi)
	}
	if retained < lag {
		t.Errorf("retained %v < lag %v: restart_lsn is never past confirmed_flush_lsn", retained, lag)
	}
	if s := got["cdcrelay_slot_safe_wal_size_bytes{slot=s1}"]; s != -1 {
		t.Errorf("safe WAL size %v, want -1 (max_slot_wal_keep_size unlimited)", s)
	}
	if n := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
		t.Fatalf("%v monitor errors:\n%s", n, r.logs.String())
	}
	if lockHolder(t, e.primaryDB) == 0 {
		t.Fatal("nobody holds the monitor lock on the primary")
	}
	failSession(t, r, e, app, true)
	failSession(t, r, e, app, false)
}

// monitorBackend is the monitor's one backend on a server; it fails the
// test if there are more.
func monitorBackend(t *testing.T, db *pgx.Conn, app string) (int32, bool) {
	t.Helper()
	bs := backends(t, db, app)
	if len(bs) > 1 {
		t.Fatalf("the monitor has %d backends, want one: %+v", len(bs), bs)
	}
	if len(bs) == 0 {
		return 0, false
	}
	return bs[0].pid, true
}

// failSession ends one of the monitor's sessions, the one on the standby
// or the lock's on the primary: the refresh fails, the other session is
// closed too (the lock given up with the first), and the monitor comes back
// with new sessions on both.
func failSession(t *testing.T, r *running, e *slotOnStandby, app string, onStandby bool) {
	t.Helper()
	slotPid, _ := monitorBackend(t, e.standbyDB, app)
	lockPid := lockHolder(t, e.primaryDB)
	victim, db := lockPid, e.primaryDB
	if onStandby {
		victim, db = slotPid, e.standbyDB
	}
	before := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total")
	exec(t, db, `SELECT pg_terminate_backend($1)`, victim)
	waitFor(t, "the failed refresh", func() bool { return testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total") > before })
	waitFor(t, "new sessions on both servers", func() bool {
		pid, ok := monitorBackend(t, e.standbyDB, app)
		holder := lockHolder(t, e.primaryDB)
		return ok && pid != slotPid && holder != 0 && holder != lockPid && isHolder(t, r)
	})
}
