package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// TestIntegrationFatalExitLoggedAtError: a relay configured for a table the
// publication does not publish (a misspelt CDCRELAY_TABLE) exits 1, and the
// exit is logged at ERROR with the cause first, where the runbook's first
// filter looks, and only once.
func TestIntegrationFatalExitLoggedAtError(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(context.Background()) }()
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	exchange := testenv.UniqueName("cdcrelay.fatal")
	if err := testenv.DeclareExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), amqpURL, exchange) })

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDCRELAY_") {
			env = append(env, kv)
		}
	}
	env = append(env, "CDCRELAY_DATABASE_URL="+pg.URL("postgres"), "CDCRELAY_AMQP_URL="+amqpURL,
		"CDCRELAY_EXCHANGE="+exchange, "CDCRELAY_HTTP_ADDR=127.0.0.1:0", "CDCRELAY_TABLE=public.event_outbx")
	relay := testenv.StartProcess(t, builds.Relay(t, true, ""), env, "run")
	err = relay.Wait(t, 30*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", err)
	}
	out := relay.Log.String()
	line, ok := lineWith(out, "level=ERROR")
	if !ok || !strings.Contains(line, `msg="fatal: `) || !strings.Contains(line, "event_outbx") {
		t.Fatalf("the first ERROR line is not the fatal cause naming the table:\n%s", out)
	}
	if _, again := lineWith(out, "cdcrelay: "); again {
		t.Errorf("the fatal error is printed again outside the log:\n%s", out)
	}
	t.Logf("the relay's output:\n%s", out)
	if strings.Contains(out, "level=INFO msg=exiting") {
		t.Errorf("a fatal exit logged as a clean one:\n%s", out)
	}
}
