package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// slotownBackend is one backend of a relay as pg_stat_activity shows it.
type slotownBackend struct {
	pid                     int32
	database                string
	backendStart            time.Time
	state, waitEvent, xmin  string
	queryStart, stateChange *time.Time
	query                   string
}

func (b slotownBackend) String() string {
	return fmt.Sprintf("pid=%d database=%s state=%q wait=%q xmin=%q query_start=%v state_change=%v query=%q",
		b.pid, b.database, b.state, b.waitEvent, b.xmin, b.queryStart, b.stateChange, b.query)
}

// slotownBackends lists the client backends with application_name app.
func slotownBackends(t *testing.T, db *pgx.Conn, app string) []slotownBackend {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT pid, datname, backend_start, coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, ''),
		       coalesce(backend_xmin::text, ''), query_start, state_change, query
		FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend' ORDER BY pid`, app)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slotownBackend, error) {
		var b slotownBackend
		err := r.Scan(&b.pid, &b.database, &b.backendStart, &b.state, &b.waitEvent, &b.xmin, &b.queryStart, &b.stateChange, &b.query)
		return b, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// slotownWaitingOnLock waits until a backend of app waits for the slot lock.
func slotownWaitingOnLock(t *testing.T, db *pgx.Conn, app string, within time.Duration) slotownBackend {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, b := range slotownBackends(t, db, app) {
			if b.waitEvent == "Lock:advisory" && b.state == "active" {
				return b
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend of %s waits for the slot lock after %s: %v", app, within, slotownBackends(t, db, app))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slotownLockHolder returns the pid holding the slot lock, 0 if none.
func slotownLockHolder(t *testing.T, db *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	err := db.QueryRow(context.Background(), `
		SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
		  AND classid = $1::bigint::oid AND objid = (hashtext($2)::bigint & 4294967295)::oid`, slot.LockClass, slotName).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// slotownStandbyProcess starts a relay process and waits until it waits
// for the slot lock.
func slotownStandbyProcess(t *testing.T, e *env, stats *pgx.Conn, name string) (*testenv.Process, string) {
	t.Helper()
	addr := freeAddr(t)
	p := e.startProcess(map[string]string{"HTTP_ADDR": addr, "DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, name), "LOG_LEVEL": "info"})
	waitReady(t, addr, "standby", 30*time.Second)
	slotownWaitingOnLock(t, stats, name, 10*time.Second)
	return p, addr
}

// TestIntegrationTakeoverAfterKill measures, over 10 trials, how long a
// standby takes to stream after the streaming relay is SIGKILLed: from the
// kill until the standby's /readyz says streaming. Nothing is lost.
func TestIntegrationTakeoverAfterKill(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	addr := freeAddr(t)
	cur := e.startProcess(map[string]string{"HTTP_ADDR": addr, "DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_0"), "LOG_LEVEL": "info"})
	waitReady(t, addr, "streaming", 30*time.Second)
	var all []row
	var took []time.Duration
	for i := 1; i <= 10; i++ {
		next, nextAddr := slotownStandbyProcess(t, e, e.db, fmt.Sprintf("slotown_%d", i))
		rows, _ := insertTxns(t, e.db, "k", 5)
		all = append(all, rows...)
		waitAll(t, e.consumer, all, 30*time.Second)
		if err := cur.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		for {
			if code, body := readyz(nextAddr); code == http.StatusOK && body == "streaming" {
				break
			}
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("trial %d: standby not streaming 30s after the kill", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		d := time.Since(killed)
		took = append(took, d)
		_ = cur.Wait(t, 10*time.Second)
		cur = next
		if d > 5*time.Second {
			t.Fatalf("trial %d: takeover took %s", i, d)
		}
	}
	rows, _ := insertTxns(t, e.db, "k", 5)
	all = append(all, rows...)
	waitAll(t, e.consumer, all, 30*time.Second)
	dups := report(t, all, e.consumer.Deliveries())
	sorted := append([]time.Duration(nil), took...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("takeover after SIGKILL over %d trials: p50 %s, max %s, min %s (all: %v); %d events, 0 missing, %d duplicates",
		len(took), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond),
		sorted[0].Round(time.Millisecond), took, len(all), dups)
}

// TestIntegrationFencedOnLockLoss: the streaming relay's slot lock
// connection is terminated by the server; it stops streaming at once, the
// standby takes over, and the consumer gets every event.
func TestIntegrationFencedOnLockLoss(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	a := e.startRelay(map[string]string{"DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_a")})
	a.waitStreaming(t)
	b := e.startRelay(map[string]string{"DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_b")})
	b.WaitFor(t, 30*time.Second, "standby", func() bool { return b.relay.Role() == relay.RoleStandby })
	slotownWaitingOnLock(t, e.db, "slotown_b", 10*time.Second)
	walsender := testenv.Walsender(t, e.db, slotName)

	stop := make(chan struct{})
	during := keepInserting(t, e, "fence", stop)
	testenv.WaitCount(t, e.consumer, 100, 30*time.Second)
	holder := slotownLockHolder(t, e.db)
	if holder == 0 {
		t.Fatal("nobody holds the slot lock while a relay streams")
	}
	if _, err := e.db.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, holder); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	a.WaitFor(t, 5*time.Second, "a to stop streaming", func() bool { return !a.relay.Streaming() })
	stopped := time.Since(cut)
	for testenv.Walsender(t, e.db, slotName) == walsender {
		if time.Since(cut) > 5*time.Second {
			t.Fatalf("the fenced relay's walsender %d still streams 5s after its lock was lost", walsender)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.WaitFor(t, 10*time.Second, "b to take over", b.relay.Streaming)
	tookOver := time.Since(cut)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	rows := <-during
	waitAll(t, e.consumer, rows, time.Minute)
	dups := report(t, rows, e.consumer.Deliveries())
	if !strings.Contains(a.logs.String(), "lost the slot lock") {
		t.Fatal("the fenced relay did not log the lost slot lock")
	}
	// The fenced relay comes back as the standby.
	a.WaitFor(t, 30*time.Second, "a to wait as standby", func() bool { return a.relay.Role() == relay.RoleStandby })
	t.Logf("lock connection terminated: relay stopped streaming after %s, standby streaming after %s; %d events, 0 missing, %d duplicates",
		stopped.Round(time.Millisecond), tookOver.Round(time.Millisecond), len(rows), dups)
}

// slotownHoldLock takes the slot lock on a connection of the test's own to
// the lock's database, as a relay in the middle of its work would hold it.
func slotownHoldLock(t *testing.T, e *env) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), e.pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	if _, err := c.Exec(context.Background(), `SELECT pg_advisory_lock($1, hashtext($2))`, slot.LockClass, slotName); err != nil {
		t.Fatal(err)
	}
	return c
}

// slotownWaitStandbyUntouched waits until c waits as the standby, failing
// if it drops the slot first (both drop paths log "recreating").
func slotownWaitStandbyUntouched(t *testing.T, c *running) {
	t.Helper()
	c.WaitFor(t, 30*time.Second, "standby", func() bool {
		if logs := c.logs.String(); strings.Contains(logs, "recreating") {
			t.Fatalf("the relay dropped the slot while another owner held it:\n%s", logs)
		}
		return c.relay.Role() == relay.RoleStandby
	})
}

func slotownSlots(t *testing.T, db *pgx.Conn) map[string]bool {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT slot_name FROM pg_replication_slots`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// TestIntegrationMarkerSeenUnderAnotherOwner is the stale-marker sequence:
// a relay that finds the slot and its adoption marker while another relay
// owns the slot (here the test holds the slot lock, as an adopter or a
// streaming relay does) must not act on them. Before the slot lock it
// dropped the healthy slot and published the whole backlog again. Now it
// waits; once the owner has ended the adoption and gone, it streams the
// existing slot without dropping it.
func TestIntegrationMarkerSeenUnderAnotherOwner(t *testing.T) {
	e, r := streamingRelay(t, nil)
	first := insertMarked(t, e, 5, 10*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	owner := slotownHoldLock(t, e)
	if _, err := e.db.Exec(context.Background(), `SELECT pg_create_physical_replication_slot($1, false)`, config.AdoptionMarkerName(slotName)); err != nil {
		t.Fatal(err)
	}
	streamed, _ := insertTxns(t, e.db, "k", 20)
	c := e.startRelay(map[string]string{"MONITOR_INTERVAL": standbyClock.String()})
	slotownWaitStandbyUntouched(t, c)
	standbyLiveFor(t, c, 2*time.Second)
	if s := slotownSlots(t, e.db); !s[slotName] || !s[config.AdoptionMarkerName(slotName)] {
		t.Fatalf("slots while another owner holds the lock: %v; the waiting relay touched them", s)
	}
	// The owner finishes its adoption (drops the marker) and goes away.
	if _, err := e.db.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, config.AdoptionMarkerName(slotName)); err != nil {
		t.Fatal(err)
	}
	if err := owner.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.waitStreaming(t)
	later, _ := insertTxns(t, e.db, "k", 5)
	all := append(append(append([]row(nil), first...), streamed...), later...)
	waitAll(t, e.consumer, all, 30*time.Second)
	logs := c.logs.String()
	if strings.Contains(logs, "created replication slot") || strings.Contains(logs, "interrupted") {
		t.Fatalf("the relay recreated the healthy slot:\n%s", logs)
	}
	if n := gauge(t, c.reg, "cdcrelay_backfill_events_total"); n != 0 {
		t.Fatalf("backfilled %v events from a recreated slot, want 0", n)
	}
	if dups := report(t, all, e.consumer.Deliveries()); dups != 0 {
		t.Fatalf("%d duplicates: the slot was not streamed from where it was", dups)
	}
}

// TestIntegrationLostSlotDroppedOnlyUnderLock: a relay that finds the slot
// invalidated drops it only while it holds the slot lock, so it can never
// drop the slot another relay has just recreated and is backfilling.
// While the test holds the lock the lost slot stays; once the lock is free
// the relay recreates it and publishes the stranded rows.
func TestIntegrationLostSlotDroppedOnlyUnderLock(t *testing.T) {
	e := newEnv(t, lostCluster, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	stranded, _ := insertTxns(t, e.db, "k", 20)
	invalidate(t, e.db)
	owner := slotownHoldLock(t, e)
	c := e.startRelay(map[string]string{"MONITOR_INTERVAL": standbyClock.String()})
	slotownWaitStandbyUntouched(t, c)
	standbyLiveFor(t, c, 2*time.Second)
	var status string
	if err := e.db.QueryRow(context.Background(), `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, slotName).Scan(&status); err != nil || status != "lost" {
		t.Fatalf("slot wal_status %q (%v) while another owner holds the lock; want it left alone", status, err)
	}
	if err := owner.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitAll(t, e.consumer, stranded, time.Minute)
	c.waitStreaming(t)
}

// TestIntegrationSlotCreationBlockedByPreparedTransaction: slot creation
// waits for a prepared transaction. The relay names it in the log within
// seconds, /readyz says why it is not ready, check reports it, SIGTERM ends
// the wait, and after COMMIT PREPARED the relay streams (the prepared row
// included, from the snapshot).
func TestIntegrationSlotCreationBlockedByPreparedTransaction(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"max_prepared_transactions": "5"}}, "#")
	ctx := context.Background()
	blocker := e.connect()
	var pending row
	if _, err := blocker.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	err := blocker.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload)
		VALUES ('k', jsonb_build_object('n', 0, 'event_type', 'TestEvent')) RETURNING id::text, routing_key, payload::text`).
		Scan(&pending.id, &pending.key, &pending.payload)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `PREPARE TRANSACTION 'slotown_blocker'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.db.Exec(context.Background(), `ROLLBACK PREPARED 'slotown_blocker'`) })

	fs := preflight.Run(ctx, e.config(nil), preflight.Options{})
	var found []string
	for _, f := range fs {
		if strings.Contains(f.Message, "slotown_blocker") {
			found = append(found, fmt.Sprintf("%s %s: %s", f.Severity, f.Check, f.Message))
		}
	}
	if len(found) != 1 || !strings.HasPrefix(found[0], "WARN") {
		t.Fatalf("check findings naming the prepared transaction: %v; want one warning (all: %+v)", found, fs)
	}
	t.Logf("check: %s", found[0])

	addr := freeAddr(t)
	vars := map[string]string{"HTTP_ADDR": addr, "LOG_LEVEL": "info"}
	p := e.startProcess(vars)
	began := time.Now()
	for !strings.Contains(p.Log.String(), "slotown_blocker") {
		if time.Since(began) > 15*time.Second {
			t.Fatalf("no log line names the prepared transaction after 15s:\n%s", p.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	logged := time.Since(began)
	code, body := readyz(addr)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "slotown_blocker") {
		t.Fatalf("/readyz while slot creation waits: %d %q; want 503 naming the prepared transaction", code, body)
	}
	t.Logf("blocked slot creation logged after %s; /readyz: %d %s", logged.Round(time.Millisecond), code, body)

	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	termed := time.Now()
	if err := p.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("relay exited with %v after SIGTERM during slot creation", err)
	}
	t.Logf("SIGTERM during the wait: exited after %s", time.Since(termed).Round(time.Millisecond))
	for deadline := time.Now().Add(10 * time.Second); slotownSlots(t, e.db)[slotName]; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the half-made slot is still there 10s after the relay exited: its walsender still waits")
		}
	}

	p = e.startProcess(vars)
	for !strings.Contains(p.Log.String(), "slotown_blocker") {
		if time.Since(began) > time.Minute {
			t.Fatalf("the second relay did not report the prepared transaction:\n%s", p.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := e.db.Exec(ctx, `COMMIT PREPARED 'slotown_blocker'`); err != nil {
		t.Fatal(err)
	}
	waitReady(t, addr, "streaming", 30*time.Second)
	rows, _ := insertTxns(t, e.db, "k", 3)
	all := append([]row{pending}, rows...)
	waitAll(t, e.consumer, all, 30*time.Second)
}

// TestIntegrationLockIgnoresRoleTimeouts: statement, lock and idle-session
// timeouts set on the relay's role (common production defaults) end
// neither the standby's wait nor the owner's hold of the slot lock.
func TestIntegrationLockIgnoresRoleTimeouts(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	if _, err := e.db.Exec(context.Background(), `ALTER ROLE cdcrelay_app SET statement_timeout = '1s'; ALTER ROLE cdcrelay_app SET lock_timeout = '1s'; ALTER ROLE cdcrelay_app SET idle_session_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	a := e.startRelay(map[string]string{"DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_a"), "STATUS_INTERVAL": statusesFast.String()})
	a.waitStreaming(t)
	b := e.startRelay(map[string]string{"DATABASE_URL": testenv.WithApplicationName(t, e.relayURL, "slotown_b")})
	b.WaitFor(t, 30*time.Second, "standby", func() bool { return b.relay.Role() == relay.RoleStandby })
	waiting := slotownWaitingOnLock(t, e.db, "slotown_b", 10*time.Second)
	holder := slotownLockHolder(t, e.db)
	liveFor(t, a, 6*time.Second) // past every timeout, with the holder's session alive throughout
	if now := slotownWaitingOnLock(t, e.db, "slotown_b", time.Second); now.pid != waiting.pid || fmt.Sprint(now.queryStart) != fmt.Sprint(waiting.queryStart) {
		t.Fatalf("the standby's wait was interrupted: %v, then %v", waiting, now)
	}
	if now := slotownLockHolder(t, e.db); now != holder || !a.relay.Streaming() {
		t.Fatalf("slot lock holder %d, then %d (a %s)", holder, now, a.relay.Role())
	}
	for name, r := range map[string]*running{"a": a, "b": b} {
		if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
			t.Fatalf("relay %s restarted %v times:\n%s", name, n, r.logs.String())
		}
	}
	// check names the holder, as operators find it.
	var lockFinding *preflight.Finding
	fs := preflight.Run(context.Background(), e.config(nil), preflight.Options{})
	for i := range fs {
		if fs[i].Check == "slot_lock" {
			lockFinding = &fs[i]
		}
	}
	if lockFinding == nil || lockFinding.Severity != preflight.OK || !strings.Contains(lockFinding.Message, fmt.Sprintf("held by pid %d", holder)) {
		t.Fatalf("check's slot_lock finding %+v; want OK naming pid %d", lockFinding, holder)
	}
	t.Logf("check: %s", lockFinding.Message)
	insertDelivered(t, e, 5)
	// A waiting standby stops at once on request.
	began := time.Now()
	if err := b.stop(t); err != nil {
		t.Fatalf("standby stopped with %v", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("a waiting standby took %s to stop", took)
	}
}

// TestIntegrationSlotStreamedOutsideLock: a relay that streams the slot
// without the slot lock (one of an older version during a rolling upgrade)
// keeps the lock's owner retrying: briefly at first, as for a dead holder's
// walsender, then every CDCRELAY_STANDBY_RETRY as a standby. Once it lets
// go, the relay streams.
func TestIntegrationSlotStreamedOutsideLock(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e, r := streamingRelay(t, nil)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "cdcrelay" // named as a relay (else TestIntegrationSlotHeldByRecvLogical)
	var other *pgconn.PgConn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if other, err = pgconn.ConnectConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		err = pglogrepl.StartReplication(ctx, other, slotName, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'cdcrelay_outbox'"},
		})
		if err == nil {
			break
		}
		_ = other.Close(ctx)
		if time.Now().After(deadline) { // the stopped relay's walsender may linger a moment
			t.Fatal(err)
		}
	}
	c := e.startRelay(map[string]string{"STANDBY_RETRY": "500ms"})
	c.WaitFor(t, 20*time.Second, "the relay to give up on the foreign holder", func() bool {
		return strings.Contains(c.logs.String(), "outside the slot lock")
	})
	if c.relay.Role() != relay.RoleStandby {
		t.Fatalf("role %s while another process streams the slot, want standby", c.relay.Role())
	}
	if !strings.Contains(c.logs.String(), "slot still active for the previous holder's walsender") {
		t.Fatal("the relay did not first retry briefly")
	}
	_ = other.Close(ctx)
	c.waitStreaming(t)
	insertDelivered(t, e, 5)
}
