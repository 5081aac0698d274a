package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// passwordRole makes role log in over TCP with password only (initdb's
// trust for everyone would take any password) and returns the URL of
// pg's postgres database as role with password.
func passwordRole(ctx context.Context, t *testing.T, pg *testenv.Postgres, db *pgx.Conn, role, password string) string {
	t.Helper()
	if _, err := db.Exec(ctx, `CREATE ROLE `+role+` LOGIN REPLICATION PASSWORD 'right-password'`); err != nil {
		t.Fatal(err)
	}
	hba := "local all all trust\nhost all " + role + " 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(pg.DataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return u.String()
}

// TestIntegrationCheckGoesOnAfterDatabaseFailure: with a wrong database
// password, check reports it with the remedy naming CDCRELAY_DATABASE_URL
// and still runs the broker's checks, so that one run lists every problem.
func TestIntegrationCheckGoesOnAfterDatabaseFailure(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, db := migratedPostgres(ctx, t)
	wrong := passwordRole(ctx, t, pg, db, "check_pw", "wrong-password")
	exchange := testenv.UniqueName("cdcrelay.checkpw")
	if err := testenv.DeclareExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), amqpURL, exchange) })

	check := testenv.StartProcess(t, builds.Relay(t, true, ""), relayEnviron(pg, amqpURL, exchange, "CDCRELAY_DATABASE_URL="+wrong), "check")
	err := check.Wait(t, time.Minute)
	out := check.Log.String()
	t.Logf("check printed:\n%s", out)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", err)
	}
	line, ok := lineWith(out, "password authentication failed")
	if !ok || !strings.HasPrefix(line, "ERROR") || !strings.Contains(line, "remedy: check the user and password in CDCRELAY_DATABASE_URL") {
		t.Errorf("the wrong password is not an ERROR whose remedy names CDCRELAY_DATABASE_URL:\n%s", line)
	}
	// "1 error, …, 5 ok" must not read as a database with one problem.
	if !strings.Contains(line, "the other database checks need this connection and did not run") {
		t.Errorf("check does not say the other database checks did not run:\n%s", line)
	}
	for _, want := range []string{"OK     broker", "OK     exchange"} {
		if _, ok := lineWith(out, want); !ok {
			t.Errorf("check stopped before the broker: no line %q", want)
		}
	}
	if strings.Contains(out, "wrong-password") {
		t.Error("check printed the password")
	}
}

// TestIntegrationCheckUnknownVariableFails: an unknown CDCRELAY_* variable
// (a typo) fails check, the deploy gate, though everything else is right;
// run only warns about it.
func TestIntegrationCheckUnknownVariableFails(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, _ := migratedPostgres(ctx, t)
	exchange := testenv.UniqueName("cdcrelay.checkvar")
	if err := testenv.DeclareExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), amqpURL, exchange) })
	bin := builds.Relay(t, true, "")

	clean := testenv.StartProcess(t, bin, relayEnviron(pg, amqpURL, exchange), "check")
	if err := clean.Wait(t, time.Minute); err != nil {
		t.Fatalf("check fails without the typo, so the test would prove nothing: %v\n%s", err, clean.Log.String())
	}
	typo := testenv.StartProcess(t, bin, relayEnviron(pg, amqpURL, exchange, "CDCRELAY_EXCHANGES="+exchange), "check")
	err := typo.Wait(t, time.Minute)
	out := typo.Log.String()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v with an unknown variable, want status 1:\n%s", err, out)
	}
	line, ok := lineWith(out, "CDCRELAY_EXCHANGES")
	if !ok || !strings.HasPrefix(line, "ERROR") || !strings.Contains(line, "did you mean CDCRELAY_EXCHANGE?") {
		t.Errorf("the unknown variable is not an ERROR with its suggestion:\n%s", out)
	}
}
