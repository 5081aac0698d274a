package testenv

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestIntegrationPostgresLifecycle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	start := time.Now()
	pg := MustPostgres(t, PostgresOptions{Settings: map[string]string{
		"wal_sender_timeout":     "5s",
		"max_slot_wal_keep_size": "64MB",
	}})
	t.Logf("cluster started in %v on port %d (%s)", time.Since(start), pg.Port(), pg.DataDir())

	if got := pg.URL("x"); got != "postgres://postgres@127.0.0.1:"+strconv.Itoa(pg.Port())+"/x?sslmode=disable" {
		t.Errorf("URL = %q", got)
	}
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}

	conn := connect(ctx, t, pg.URL("app"))
	for setting, want := range map[string]string{
		"wal_level":              "logical",
		"wal_sender_timeout":     "5s",
		"max_slot_wal_keep_size": "64MB",
		"listen_addresses":       "127.0.0.1",
		"max_replication_slots":  "20",
	} {
		if got := show(ctx, t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	// The point of wal_level=logical: a pgoutput slot can be created.
	mustExec(ctx, t, conn, "SELECT pg_create_logical_replication_slot('testenv_slot', 'pgoutput')")
	mustExec(ctx, t, conn, "CREATE TABLE t (v int)")
	mustExec(ctx, t, conn, "INSERT INTO t VALUES (1)")
	conn.Close(ctx)

	port := pg.Port()
	for _, mode := range []string{"fast", "immediate"} {
		if err := pg.Restart(ctx, mode); err != nil {
			t.Fatalf("restart -m %s: %v", mode, err)
		}
		if pg.Port() != port {
			t.Fatalf("port changed across restart: %d -> %d", port, pg.Port())
		}
		conn := connect(ctx, t, pg.URL("app"))
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
			t.Fatalf("after restart -m %s: count = %d, err = %v", mode, n, err)
		}
		var slots int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'testenv_slot'").Scan(&slots); err != nil || slots != 1 {
			t.Fatalf("after restart -m %s: slot count = %d, err = %v", mode, slots, err)
		}
		conn.Close(ctx)
	}

	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, pg.URL("app")); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	if err := pg.Stop(ctx, "bogus"); err == nil {
		t.Error("Stop accepted an unknown mode")
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	connect(ctx, t, pg.URL("app")).Close(ctx)

	if !strings.Contains(pg.ServerLog(), "database system is ready to accept connections") {
		t.Errorf("server log lacks the ready message:\n%s", pg.ServerLog())
	}

	dir := pg.DataDir()
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s still exists after Close (stat err %v)", dir, err)
	}
	if err := pg.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestIntegrationStartPostgresReportsServerLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log bytes.Buffer
	pg, err := StartPostgres(ctx, PostgresOptions{
		Settings: map[string]string{"wal_level": "bogus"},
		Log:      &log,
	})
	if err == nil {
		pg.Close()
		t.Fatal("cluster with wal_level=bogus started")
	}
	msg := err.Error()
	for _, want := range []string{"start postgres", "pg_ctl start", `invalid value for parameter "wal_level"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if !strings.Contains(log.String(), "wal_level") {
		t.Errorf("opts.Log did not get the server log; got:\n%s", log.String())
	}
}

func TestUniqueName(t *testing.T) {
	t.Parallel()
	a, b := UniqueName("slot"), UniqueName("slot")
	if a == b || !strings.HasPrefix(a, "slot_") || len(a) != len("slot_")+12 {
		t.Errorf("UniqueName gave %q and %q", a, b)
	}
}

func connect(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return conn
}

func show(ctx context.Context, t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(ctx, "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func mustExec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
