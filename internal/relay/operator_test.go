package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Conditions only an operator can fix: the relay says so at ERROR with the
// remedy and on its status (/readyz), creates no slot while they hold (the
// role without SELECT used to create and drop one on every retry), and
// streams once the operator has acted, without a restart.

// waitNeedsOperator waits for a status naming remedy and for two sessions
// refused for it, then checks what the relay logged and that it left no
// slot behind.
func waitNeedsOperator(t *testing.T, e *env, r *running, remedy string) {
	t.Helper()
	r.WaitFor(t, time.Minute, "two retries that name "+remedy, func() bool {
		return strings.HasPrefix(r.relay.Status(), "starting: needs an operator: ") &&
			strings.Contains(r.relay.Status(), remedy) &&
			strings.Count(r.logs.String(), "needs an operator") >= 2
	})
	t.Logf("status: %s", r.relay.Status())
	if got := statusReason(t, r.reg); got != "needs_operator" {
		t.Errorf("cdcrelay_status says %q, want needs_operator", got)
	}
	if strings.Contains(r.relay.Status(), relayRolePassword) || strings.Contains(r.relay.Status(), "…") {
		t.Errorf("status %q: a password, or the remedy clipped", r.relay.Status())
	}
	for line := range strings.SplitSeq(r.logs.String(), "\n") {
		if strings.Contains(line, "needs an operator") && (!strings.Contains(line, "level=ERROR") || !strings.Contains(line, remedy)) {
			t.Errorf("not at ERROR with the remedy: %s", line)
		}
	}
	if strings.Contains(r.logs.String(), "a retry cannot fix this") {
		t.Error("the log says a retry cannot help while the relay retries")
	}
	if strings.Contains(r.logs.String(), "previous adoption of this slot was interrupted") {
		t.Error("a retry dropped and recreated the slot")
	}
	var slots int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Errorf("%d slots exist while the relay cannot adopt: it must create none", slots)
	}
}

// statusReason is the reason cdcrelay_status sets to 1; it fails the
// test unless exactly one is.
func statusReason(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	var on []string
	for _, m := range metricFamily(t, reg, "cdcrelay_status").GetMetric() {
		if testenv.Value(m) != 1 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				on = append(on, l.GetValue())
			}
		}
	}
	if len(on) != 1 {
		t.Fatalf("cdcrelay_status: %d reasons at 1 (%v), want one", len(on), on)
	}
	return on[0]
}

func TestIntegrationNeedsOperatorSelectGrant(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `REVOKE SELECT ON event_outbox FROM cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	rows, _ := insertTxns(t, e.db, "orders.created", 3)
	r := e.startRelay(nil)
	waitNeedsOperator(t, e, r, "GRANT SELECT ON public.event_outbox TO cdcrelay_app;")
	if _, err := e.db.Exec(ctx, `GRANT SELECT ON event_outbox TO cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	r.waitStreaming(t)
	testenv.WaitCount(t, e.consumer, len(rows), time.Minute)
	if dups := report(t, rows, e.consumer.Deliveries()); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

func TestIntegrationNeedsOperatorReplicationRole(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `ALTER ROLE cdcrelay_app NOREPLICATION`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(nil)
	waitNeedsOperator(t, e, r, "ALTER ROLE cdcrelay_app REPLICATION;")
	if _, err := e.db.Exec(ctx, `ALTER ROLE cdcrelay_app REPLICATION`); err != nil {
		t.Fatal(err)
	}
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "orders.created", 2)
	testenv.WaitCount(t, e.consumer, len(rows), time.Minute)
}

// wal_level needs a restart of PostgreSQL, which the relay rides out like
// any outage.
func TestIntegrationNeedsOperatorWALLevel(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}}, "#")
	r := e.startRelay(nil)
	waitNeedsOperator(t, e, r, "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.db.Exec(ctx, `ALTER SYSTEM SET wal_level = logical`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	// Set and reloaded: what is left is the restart, and the remedy says so.
	r.WaitFor(t, 30*time.Second, "the remedy to ask for the restart only", func() bool {
		return strings.Contains(r.relay.Status(), "restart PostgreSQL: the new wal_level applies only after a restart")
	})
	if err := e.pg.Restart(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	r.waitStreaming(t)
	e.db = e.connect()
	rows, _ := insertTxns(t, e.db, "orders.created", 2)
	testenv.WaitCount(t, e.consumer, len(rows), time.Minute)
}
