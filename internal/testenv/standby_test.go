package testenv

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

func TestIntegrationStandbyReplays(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := MustPostgres(t, PostgresOptions{Settings: map[string]string{"wal_sender_timeout": "7s"}})

	// Major is what the server says it is, and what PGMajor predicted.
	major, err := primary.Major()
	if err != nil {
		t.Fatal(err)
	}
	if want, err := PGMajor(); err != nil || want != major {
		t.Fatalf("PGMajor() = %d, %v; the cluster's Major() = %d", want, err, major)
	}
	pconn := connect(ctx, t, primary.URL("postgres"))
	defer pconn.Close(ctx)
	if got := show(ctx, t, pconn, "server_version_num"); got[:len(got)-4] != strconv.Itoa(major) {
		t.Fatalf("server_version_num %s, Major() %d", got, major)
	}
	// The primary's logical slot must not turn up on the standby.
	mustExec(ctx, t, pconn, "SELECT pg_create_logical_replication_slot('primary_only', 'pgoutput')")
	pconn.Close(ctx)

	standby := MustStandby(t, primary, StandbyOptions{
		Slot:     "replica_slot",
		Name:     "replica_app",
		Settings: map[string]string{"wal_receiver_status_interval": "2s"},
	})
	if standby.Port() == primary.Port() || standby.DataDir() == primary.DataDir() {
		t.Fatalf("standby shares port %d or data dir %s with the primary", standby.Port(), standby.DataDir())
	}

	pconn = connect(ctx, t, primary.URL("postgres"))
	defer pconn.Close(ctx)
	mustExec(ctx, t, pconn, "CREATE TABLE t (v int)")
	mustExec(ctx, t, pconn, "INSERT INTO t SELECT generate_series(1, 100)")
	var app, state, slotActive string
	err = pconn.QueryRow(ctx, `SELECT r.application_name, r.state, s.active::text
		FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
		WHERE s.slot_name = 'replica_slot' AND s.slot_type = 'physical'`).Scan(&app, &state, &slotActive)
	if err != nil || app != "replica_app" || state != "streaming" || slotActive != "true" {
		t.Fatalf("replication of slot replica_slot: application_name %q, state %q, active %q, err %v", app, state, slotActive, err)
	}
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatal(err)
	}

	sconn := connect(ctx, t, standby.URL("postgres"))
	defer sconn.Close(ctx)
	var n int
	var inRecovery bool
	if err := sconn.QueryRow(ctx, "SELECT count(*), pg_is_in_recovery() FROM t").Scan(&n, &inRecovery); err != nil || n != 100 || !inRecovery {
		t.Fatalf("standby: count %d, in recovery %v, err %v; want 100 rows in recovery", n, inRecovery, err)
	}
	for setting, want := range map[string]string{
		"wal_sender_timeout":           "7s", // the primary's own setting
		"wal_receiver_status_interval": "2s",
		"hot_standby_feedback":         "on",
		"primary_slot_name":            "replica_slot",
		"wal_level":                    "logical",
		"port":                         strconv.Itoa(standby.Port()),
	} {
		if got := show(ctx, t, sconn, setting); got != want {
			t.Errorf("standby: SHOW %s = %q, want %q", setting, got, want)
		}
	}
	var slots int
	if err := sconn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Errorf("standby has %d replication slots (err %v), want none of the primary's", slots, err)
	}
	_, err = sconn.Exec(ctx, "INSERT INTO t VALUES (0)")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("insert on the standby: %v, want read_only_sql_transaction (25006)", err)
	}
}

func TestIntegrationStandbyPromote(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := MustPostgres(t, PostgresOptions{})
	standby := MustStandby(t, primary, StandbyOptions{})

	pconn := connect(ctx, t, primary.URL("postgres"))
	defer pconn.Close(ctx)
	var app string
	if err := pconn.QueryRow(ctx, "SELECT application_name FROM pg_stat_replication").Scan(&app); err != nil || app != "standby1" {
		t.Fatalf("default application_name %q (err %v), want standby1", app, err)
	}
	mustExec(ctx, t, pconn, "CREATE TABLE t (v int)")
	mustExec(ctx, t, pconn, "INSERT INTO t VALUES (1)")
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatal(err)
	}

	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sconn := connect(ctx, t, standby.URL("postgres"))
	defer sconn.Close(ctx)
	mustExec(ctx, t, sconn, "INSERT INTO t VALUES (2)")
	// The promoted server can host a logical slot: what a relay needs after
	// a failover.
	mustExec(ctx, t, sconn, "SELECT pg_create_logical_replication_slot('after_promote', 'pgoutput')")
	var n int
	if err := sconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("promoted: count %d, err %v; want 2", n, err)
	}
	// The old primary goes on alone.
	if err := pconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("old primary: count %d, err %v; want 1", n, err)
	}
}

func TestIntegrationStandbyKilledPrimary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := MustPostgres(t, PostgresOptions{})
	standby := MustStandby(t, primary, StandbyOptions{})
	pconn := connect(ctx, t, primary.URL("postgres"))
	mustExec(ctx, t, pconn, "CREATE TABLE t (v int)")
	mustExec(ctx, t, pconn, "INSERT INTO t VALUES (1)")
	pconn.Close(ctx)
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatal(err)
	}

	pid := postmasterPID(t, primary)
	children := svckit.Children(pid)
	if len(children) == 0 {
		t.Fatalf("postmaster %d has no children", pid)
	}
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	assertDown(t, primary)
	for _, c := range append(children, pid) {
		if svckit.Alive(c) {
			t.Errorf("process %d of the killed cluster still runs", c)
		}
	}
	if err := primary.Kill(ctx); err == nil {
		t.Error("Kill of a killed cluster succeeded")
	}
	// A stale pid file naming a reused pid (here: this test) kills nothing.
	stale := filepath.Join(primary.DataDir(), "postmaster.pid")
	if err := os.WriteFile(stale, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := primary.Kill(ctx); err == nil || !strings.Contains(err.Error(), "not this cluster's postmaster") {
		t.Errorf("Kill with a stale pid file: %v, want a refusal", err)
	}
	if err := os.Remove(stale); err != nil {
		t.Fatal(err)
	}

	// The standby outlives its primary and takes over.
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sconn := connect(ctx, t, standby.URL("postgres"))
	mustExec(ctx, t, sconn, "INSERT INTO t VALUES (2)")
	sconn.Close(ctx)

	// The killed primary starts again (crash recovery) with its data.
	if err := primary.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pconn = connect(ctx, t, primary.URL("postgres"))
	var n int
	if err := pconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("restarted primary: count %d, err %v; want 1", n, err)
	}
	pconn.Close(ctx)

	// Killed again, Close still removes everything.
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := primary.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(primary.DataDir()); !os.IsNotExist(err) {
		t.Errorf("data dir %s still exists after Close (stat err %v)", primary.DataDir(), err)
	}
}

// TestIntegrationStandbyKillStandby: a killed standby (and its walreceiver)
// leave the primary running, and Close cleans up after it.
func TestIntegrationStandbyKillStandby(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := MustPostgres(t, PostgresOptions{})
	standby, err := primary.StartStandby(ctx, StandbyOptions{Slot: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	if err := standby.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	assertDown(t, standby)
	pconn := connect(ctx, t, primary.URL("postgres"))
	defer pconn.Close(ctx)
	var active bool
	deadline := time.Now().Add(time.Minute)
	for {
		err := pconn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'doomed'").Scan(&active)
		if err != nil {
			t.Fatal(err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot doomed still active a minute after its standby was killed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := standby.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(standby.DataDir()); !os.IsNotExist(err) {
		t.Errorf("standby data dir %s still exists after Close (stat err %v)", standby.DataDir(), err)
	}
}

func postmasterPID(t *testing.T, p *Postgres) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.DataDir(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// assertDown checks that a killed cluster refuses connections and left no
// pid file behind.
func assertDown(t *testing.T, p *Postgres) {
	t.Helper()
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port())), time.Second); err == nil {
		conn.Close()
		t.Errorf("port %d still accepts connections after Kill", p.Port())
	}
	if c, err := pgx.Connect(context.Background(), p.URL("postgres")); err == nil {
		c.Close(context.Background())
		t.Error("connected to a killed cluster")
	}
	if _, err := os.Stat(filepath.Join(p.DataDir(), "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("postmaster.pid still there after Kill (stat err %v)", err)
	}
}
