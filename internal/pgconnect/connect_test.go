package pgconnect

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// silentServer accepts connections and never answers, as a hung server or
// a black-holing proxy does. It returns its host:port.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestConnectNamesTheRole: every failure says which connection failed
// ("connect <role>: …"), never quotes a malformed URL (it may hold a
// password), and keeps the *pgconn.ConnectError in the chain.
func TestConnectNamesTheRole(t *testing.T) {
	ctx := context.Background()
	_, err := Connect(ctx, "postgres://u:sekret@db:notaport/app", "to database", Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "connect to database: ") || strings.Contains(err.Error(), "sekret") {
		t.Fatalf("malformed URL: %v", err)
	}
	_, err = ConnectReplication(ctx, "postgres://u:sekret@db:notaport/app", "for replication", Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "connect for replication: ") || strings.Contains(err.Error(), "sekret") {
		t.Fatalf("malformed replication URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "postgres://u@" + ln.Addr().String() + "/app?sslmode=disable"
	_ = ln.Close() // nothing listens there now
	_, err = Connect(ctx, refused, "to the slot's server for marks", Options{})
	var ce *pgconn.ConnectError
	if err == nil || !strings.HasPrefix(err.Error(), "connect to the slot's server for marks: ") || !errors.As(err, &ce) {
		t.Fatalf("refused connection: %v", err)
	}
}

// TestConnectTimeout: an attempt on a server that never answers ends after
// Timeout, or after the URL's connect_timeout when it sets one.
func TestConnectTimeout(t *testing.T) {
	addr := silentServer(t)
	for _, c := range []struct {
		query    string
		min, max time.Duration
	}{
		{"&connect_timeout=1", time.Second, 5 * time.Second},
		{"", Timeout, Timeout + 5*time.Second},
	} {
		began := time.Now()
		_, err := Connect(context.Background(), "postgres://u@"+addr+"/app?sslmode=disable"+c.query, "to database", Options{})
		took := time.Since(began)
		if err == nil || !strings.HasPrefix(err.Error(), "connect to database: ") || took < c.min-100*time.Millisecond || took > c.max {
			t.Fatalf("URL query %q: %v after %s, want a failure after %s to %s", c.query, err, took, c.min, c.max)
		}
	}
}

// TestConnectOptionsTimeout: Options.Timeout bounds each attempt of both
// openers, over the URL's connect_timeout too (cdcrelay check's -timeout),
// and ConnectReplication refuses the options it cannot honour.
func TestConnectOptionsTimeout(t *testing.T) {
	addr := silentServer(t)
	url := "postgres://u@" + addr + "/app?sslmode=disable&connect_timeout=30"
	const limit = 500 * time.Millisecond
	for name, connect := range map[string]func() error{
		"Connect": func() error {
			_, err := Connect(context.Background(), url, "to database", Options{Timeout: limit})
			return err
		},
		"ConnectReplication": func() error {
			_, err := ConnectReplication(context.Background(), url, "for replication", Options{Timeout: limit})
			return err
		},
	} {
		began := time.Now()
		err := connect()
		took := time.Since(began)
		if err == nil || !strings.HasPrefix(err.Error(), "connect ") || took < limit-100*time.Millisecond || took > limit+5*time.Second {
			t.Fatalf("%s: %v after %s, want a failure after %s", name, err, took, limit)
		}
	}
	for _, o := range []Options{{Database: "postgres"}, {LockHolder: true}, {Setup: func(context.Context, *pgx.Conn) error { return nil }}} {
		if _, err := ConnectReplication(context.Background(), url, "for replication", o); err == nil || !strings.HasPrefix(err.Error(), "connect for replication: ") {
			t.Fatalf("replication connection with %+v: %v, want it refused", o, err)
		}
	}
}

// TestIntegrationConnectSetUp: each role's connection carries what its
// options say, on a real server: the relay's application_name and UTF8;
// a lock holder's keepalives and no statement, lock or idle-session
// timeout; another database; forced parameters over the URL's; a failed
// set-up closes the connection and names the role; and a replication
// connection answers IDENTIFY_SYSTEM.
func TestIntegrationConnectSetUp(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	for _, sql := range []string{`CREATE DATABASE app`, `ALTER ROLE postgres SET statement_timeout = '1h'`,
		`ALTER ROLE postgres SET lock_timeout = '7s'`, `ALTER ROLE postgres SET idle_session_timeout = '1h'`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	show := func(db *pgx.Conn, names ...string) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, n := range names {
			var v string
			if err := db.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&v); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			got[n] = v
		}
		return got
	}

	plain, err := Connect(ctx, pg.URL("app"), "to database", Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := show(plain, "application_name", "client_encoding", "statement_timeout", "lock_timeout")
	_ = plain.Close(ctx)
	if got["application_name"] != ApplicationName || got["client_encoding"] != "UTF8" || got["statement_timeout"] != "1h" || got["lock_timeout"] != "7s" {
		t.Fatalf("plain connection: %v (want the role's timeouts kept)", got)
	}

	holder, err := Connect(ctx, pg.URL("app"), "to the lock's database", Options{Database: "postgres", LockHolder: true})
	if err != nil {
		t.Fatal(err)
	}
	got = show(holder, "tcp_keepalives_idle", "statement_timeout", "lock_timeout", "idle_session_timeout")
	var database string
	if err := holder.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		t.Fatal(err)
	}
	_ = holder.Close(ctx)
	if database != "postgres" || got["tcp_keepalives_idle"] != "10" || got["statement_timeout"] != "0" || got["lock_timeout"] != "0" || got["idle_session_timeout"] != "0" {
		t.Fatalf("lock holder: database %s, %v", database, got)
	}

	forced, err := Connect(ctx, pg.URL("app")+"&application_name=mine", "to database for retention",
		Options{Force: map[string]string{"application_name": "cdcrelay retention", "statement_timeout": "60000"}})
	if err != nil {
		t.Fatal(err)
	}
	got = show(forced, "application_name", "statement_timeout")
	_ = forced.Close(ctx)
	if got["application_name"] != "cdcrelay retention" || got["statement_timeout"] != "1min" {
		t.Fatalf("forced parameters: %v", got)
	}

	var setupDB *pgx.Conn
	boom := errors.New("boom")
	_, err = Connect(ctx, pg.URL("app"), "to database for marks", Options{Setup: func(ctx context.Context, db *pgx.Conn) error {
		setupDB = db
		return boom
	}})
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "connect to database for marks: ") || setupDB == nil || !setupDB.IsClosed() {
		t.Fatalf("failed set-up: %v; connection left open: %v", err, setupDB != nil && !setupDB.IsClosed())
	}

	repl, err := ConnectReplication(ctx, pg.URL("app"), "for replication", Options{Params: map[string]string{"statement_timeout": "0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = repl.Close(context.Background()) }()
	if _, err := repl.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
		t.Fatalf("IDENTIFY_SYSTEM on the replication connection: %v", err)
	}
}
