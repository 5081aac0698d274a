package pgconnect

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationConnectDurable: a Durable connection commits with
// synchronous_commit local where the role, the URL or the server says off,
// keeps a stronger setting (remote_apply) as it is, and keeps its value
// when the server's is reloaded to off meanwhile, while a plain
// connection follows each of them.
func TestIntegrationConnectDurable(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	for _, sql := range []string{`CREATE ROLE async_role LOGIN SUPERUSER`, `ALTER ROLE async_role SET synchronous_commit = off`,
		`CREATE ROLE apply_role LOGIN SUPERUSER`, `ALTER ROLE apply_role SET synchronous_commit = remote_apply`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	as := func(role string) string {
		return "postgres://" + role + "@127.0.0.1:" + strconv.Itoa(pg.Port()) + "/postgres?sslmode=disable"
	}
	setting := func(db *pgx.Conn) string {
		t.Helper()
		var v string
		if err := db.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	open := func(url string, durable bool) *pgx.Conn {
		t.Helper()
		db, err := Connect(ctx, url, "to database for marks", Options{Durable: durable})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close(context.Background()) })
		return db
	}

	for _, c := range []struct {
		what, url      string
		plain, durable string
	}{
		{"the role's off", as("async_role"), "off", "local"},
		{"the URL's off", pg.URL("postgres") + "&synchronous_commit=off", "off", "local"},
		{"the role's remote_apply", as("apply_role"), "remote_apply", "remote_apply"},
		{"the server's default", pg.URL("postgres"), "on", "on"},
	} {
		if got, want := setting(open(c.url, false)), c.plain; got != want {
			t.Errorf("%s, plain connection: synchronous_commit %s, want %s", c.what, got, want)
		}
		if got, want := setting(open(c.url, true)), c.durable; got != want {
			t.Errorf("%s, durable connection: synchronous_commit %s, want %s", c.what, got, want)
		}
	}

	plain, pinned := open(pg.URL("postgres"), false), open(pg.URL("postgres"), true)
	for _, sql := range []string{`ALTER SYSTEM SET synchronous_commit = off`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// A session reads the reloaded file between statements, once the
	// postmaster's SIGHUP reached it.
	for deadline := time.Now().Add(10 * time.Second); setting(plain) != "off"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a plain connection still commits synchronously 10 s after the reload to off")
		}
	}
	if got := setting(pinned); got != "on" {
		t.Fatalf("after a reload to off, the durable connection opened before it commits with synchronous_commit %s, want on", got)
	}
	if got := setting(open(pg.URL("postgres"), true)); got != "local" {
		t.Fatalf("after a reload to off, a new durable connection commits with synchronous_commit %s, want local", got)
	}
}
