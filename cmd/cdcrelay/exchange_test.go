package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// TestIntegrationDeletedExchangeNamed runs the relay against the real broker, deletes
// its exchange while it streams and inserts a row: the error the relay
// logs must carry the broker's 404 NOT_FOUND with the exchange's name and
// the remedy, not only "channel closed".
func TestIntegrationDeletedExchangeNamed(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, db := migratedPostgres(ctx, t)
	exchange := testenv.UniqueName("cdcrelay.deleted")
	consumer := testenv.MustConsumer(t, amqpURL, exchange, testenv.UniqueName("cdcrelay.deleted"), "#") // declares the exchange
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, exchange) // already gone unless the test failed early
	})

	relay := testenv.StartProcess(t, builds.Relay(t, true, ""), relayEnviron(pg, amqpURL, exchange), "run")

	insert := func() {
		t.Helper()
		if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('orders.created', '{}')`); err != nil {
			t.Fatal(err)
		}
	}
	insert()
	if err := consumer.WaitCount(ctx, 1); err != nil {
		t.Fatalf("the first event never arrived: %v", err)
	}
	if err := testenv.DeleteExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	mark := len(relay.Log.String())
	insert()

	for {
		after := relay.Log.String()[mark:]
		// The first error after the deletion is the one that must say why.
		if line, ok := lineWith(after, "level=ERROR"); ok {
			for _, want := range []string{"404 NOT_FOUND", "no exchange '" + exchange + "'", "declare it", "CDCRELAY_EXCHANGE"} {
				if !strings.Contains(line, want) {
					t.Errorf("the first error after the exchange was deleted lacks %q:\n%s", want, line)
				}
			}
			t.Logf("the relay's log after the exchange was deleted:\n%s", after)
			return
		}
		if exited, err := relay.Exited(); exited {
			t.Fatalf("relay exited (%v) without logging an error:\n%s", err, after)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no error logged after the exchange was deleted:\n%s", after)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// migratedPostgres starts a cluster with the outbox migrated into its
// postgres database, and connects to it; both end with the test.
func migratedPostgres(ctx context.Context, t *testing.T) (*testenv.Postgres, *pgx.Conn) {
	t.Helper()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	db, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	return pg, db
}

// relayEnviron is the relay's environment for pg and the exchange: this
// process's without its CDCRELAY_ variables, then extra (NAME=value).
func relayEnviron(pg *testenv.Postgres, amqpURL, exchange string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDCRELAY_") {
			env = append(env, kv)
		}
	}
	env = append(env, "CDCRELAY_DATABASE_URL="+pg.URL("postgres"), "CDCRELAY_AMQP_URL="+amqpURL,
		"CDCRELAY_EXCHANGE="+exchange, "CDCRELAY_HTTP_ADDR=127.0.0.1:0")
	return append(env, extra...)
}

// lineWith returns the first line of s containing sub.
func lineWith(s, sub string) (string, bool) {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			return line, true
		}
	}
	return "", false
}
