package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationAdoptionOutlivesIdleTimeout: the snapshot transaction of
// an adoption sits idle while the broker holds the publisher back. A role
// whose idle_in_transaction_session_timeout is shorter than that wait must
// not end the adoption: the backlog is delivered in one adoption, without
// a restart.
func TestIntegrationAdoptionOutlivesIdleTimeout(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER ROLE cdcrelay_app SET idle_in_transaction_session_timeout = '500ms'`); err != nil {
		t.Fatal(err)
	}
	old := backlog(t, e.db, "backlog", 2000)
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	// Room for a few events only: with the broker held, the publisher waits
	// for confirms and the snapshot's reader for room in the byte budget,
	// its transaction (and the replication connection's) idle meanwhile.
	r := e.startRelay(map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + proxy.Addr() + "/", "MAX_IN_FLIGHT": "10", "MAX_IN_FLIGHT_BYTES": "1KiB",
	})
	r.WaitFor(t, 30*time.Second, "the adoption", func() bool { return gauge(t, r.reg, "cdcrelay_backfill_running") == 1 })
	proxy.HoldUpstream(true)
	time.Sleep(2 * time.Second) // four times the role's idle timeout
	proxy.HoldUpstream(false)
	waitAll(t, e.consumer, old, time.Minute)
	r.waitStreaming(t)
	if n := gauge(t, r.reg, "cdcrelay_pipeline_restarts_total"); n != 0 {
		t.Fatalf("%v restarts during the adoption:\n%s", n, r.logs.String())
	}
	if strings.Contains(r.logs.String(), "idle-in-transaction") {
		t.Fatalf("the snapshot transaction was ended by the idle timeout:\n%s", r.logs.String())
	}
	t.Logf("adoption of %d rows held by the broker for 2 s under a 500 ms idle-in-transaction timeout: delivered, 0 restarts", len(old))
}
