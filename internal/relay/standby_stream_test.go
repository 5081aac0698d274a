//go:build pgmatrix

package relay_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// This file needs PostgreSQL 16 or later (logical decoding on a standby):
// make test-pg-matrix runs it (build tag pgmatrix).

const standbySlot = "cdcrelay_on_standby"

// standbyWorld is a primary with the outbox, a physical standby of it, and
// the relay's role allowed to ask the primary for standby snapshots.
type standbyWorld struct {
	*env
	sb       *testenv.Postgres
	link     *testenv.Proxy // between the standby and the primary: the standby's WAL flows through it
	primary  *pgx.Conn      // superuser, on the primary
	standby  *pgx.Conn      // superuser, on the standby
	relayURL string         // both servers, read-write: the primary, later the promoted standby
	replURL  string         // the relay's role on the standby
}

func newStandbyWorld(t *testing.T, standbyOpts testenv.StandbyOptions) *standbyWorld {
	t.Helper()
	testenv.RequireMajor(t, 16)
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	if _, err := e.db.Exec(context.Background(), `GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	// The standby reaches the primary through a proxy, so a test can
	// freeze its WAL while the relay and the producer still reach the
	// primary.
	link := testenv.MustProxy(t, "127.0.0.1:"+strconv.Itoa(e.pg.Port()))
	host, port, _ := strings.Cut(link.Addr(), ":")
	name := standbyOpts.Slot
	settings := map[string]string{"primary_conninfo": "host=" + host + " port=" + port + " user=postgres dbname=postgres application_name=" + name}
	for k, v := range standbyOpts.Settings {
		settings[k] = v
	}
	standbyOpts.Settings = settings
	sb := testenv.MustStandby(t, e.pg, standbyOpts)
	w := &standbyWorld{env: e, sb: sb, link: link, primary: relaytest.Connect(t, e.dbURL), standby: relaytest.Connect(t, sb.URL("app"))}
	w.relayURL = multiHostURL(t, e.relayURL, e.pg.Port(), sb.Port())
	w.replURL = strings.Replace(e.relayURL, "127.0.0.1:"+strconv.Itoa(e.pg.Port()), "127.0.0.1:"+strconv.Itoa(sb.Port()), 1)
	return w
}

func (w *standbyWorld) start(t *testing.T, extra map[string]string) *relaytest.InProcess {
	t.Helper()
	vars := map[string]string{"SLOT": standbySlot, "REPLICATION_URL": w.replURL, "BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s",
		"MARK_INTERVAL": "50ms", "LOG_LEVEL": "debug"}
	for k, v := range extra {
		vars[k] = v
	}
	r := relaytest.Start(t, relaytest.Config(t, relaytest.Vars(w.relayURL, w.amqpURL, w.exchange, vars)),
		relaytest.InProcessOptions{LogTo: testWriter{t}})
	t.Cleanup(func() { _ = r.Stop() })
	r.WaitFor(t, 60*time.Second, "streaming", r.Relay.Streaming)
	return r
}

// TestIntegrationStandbySlotStreams: with CDCRELAY_REPLICATION_URL on a
// standby, 5,000 events (1,000 of them a backlog the adoption publishes)
// arrive once each, every row is marked on the
// primary, the slot is the standby's, and the primary has no logical slot
// and no logical walsender: it decodes nothing for the relay.
func TestIntegrationStandbySlotStreams(t *testing.T) {
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
	// A backlog before the relay starts: the adoption reads it through
	// the snapshot the slot exported on the standby.
	all, _ := insertTxns(t, w.primary, "k", 500, 500)
	r := w.start(t, nil)
	for range 80 {
		rows, _ := insertTxns(t, w.primary, "k", 50)
		all = append(all, rows...)
	}
	waitAll(t, w.consumer, all, 120*time.Second)
	waitUntil(t, 60*time.Second, "every row marked on the primary", func() bool {
		var n int
		return w.primary.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&n) == nil && n == 0
	})
	if n := w.consumer.Count(); n != len(all) {
		t.Errorf("%d deliveries of %d events: want each once", n, len(all))
	}
	ctx := context.Background()
	var logicalSlots, logicalSenders int
	if err := w.primary.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'),
		(SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_type = 'logical')`).
		Scan(&logicalSlots, &logicalSenders); err != nil {
		t.Fatal(err)
	}
	if logicalSlots != 0 || logicalSenders != 0 {
		t.Errorf("the primary has %d logical slots and %d logical walsenders; want none", logicalSlots, logicalSenders)
	}
	if exists, _, _, _, _, err := slotRow(ctx, w.standby, standbySlot); err != nil || !exists {
		t.Fatalf("slot %s on the standby: exists %v, %v", standbySlot, exists, err)
	}
	if !strings.Contains(r.Logs.String(), "created replication slot") {
		t.Error("the relay did not say it created its slot")
	}
	t.Logf("%d events, %d deliveries, all marked; no logical decoding on the primary", len(all), w.consumer.Count())
}

// TestIntegrationStandbySlotPromoted: the primary dies (SIGKILL) under
// load and the standby that holds the slot is promoted. Before the
// promotion, every event the slot has passed is marked on the standby;
// after it, the relay streams on from the same slot (no new slot), every
// row of the new primary is delivered and marked, and nothing is
// published that the new primary lacks.
func TestIntegrationStandbySlotPromoted(t *testing.T) {
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
	r := w.start(t, nil)
	promoteUnderLoad(t, w, r, nil)
}

// TestIntegrationStandbySlotPromotedAfterFrozenLink: as above, but the
// standby's WAL link is frozen 1.5 s before the primary dies, so the
// marks written meanwhile never reach it. The slot on the standby must
// not have passed their rows: they are published again and marked on the
// promoted standby, never left unmarked behind the slot.
func TestIntegrationStandbySlotPromotedAfterFrozenLink(t *testing.T) {
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
	// Marks once a second: a mark batch always falls inside the 1.5 s
	// freeze, so some delivered events always lack their marks on the
	// standby when the primary dies (with 50 ms, a run could miss it).
	r := w.start(t, map[string]string{"MARK_INTERVAL": "1s"})
	promoteUnderLoad(t, w, r, func() {
		w.link.HoldDownstream(true)
		time.Sleep(1500 * time.Millisecond)
	})
}

// promoteUnderLoad runs a producer, kills the primary once 500 events were
// delivered (after beforeKill, if set), checks that the slot on the
// standby passed no unmarked row, promotes the standby and checks the
// outcome.
func promoteUnderLoad(t *testing.T, w *standbyWorld, r *relaytest.InProcess, beforeKill func()) {
	t.Helper()
	ctx := context.Background()
	prod := startProducer(t, multiHostURL(t, w.dbURL, w.pg.Port(), w.sb.Port()))
	waitUntil(t, 60*time.Second, "500 events delivered under load", func() bool { return w.consumer.Count() >= 500 })
	if beforeKill != nil {
		beforeKill()
	}
	restarts := gauge(t, r.Reg, "cdcrelay_pipeline_restarts_total")
	if err := w.pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// The slot lock lived on the primary: the session ends, and the relay
	// counts the restart once it has. Whatever the slot confirmed before
	// must be marked on the standby.
	waitCounter(t, r.Reg, "cdcrelay_pipeline_restarts_total", restarts+1, 30*time.Second)
	_, _, _, _, confirmed, err := slotRow(ctx, w.standby, standbySlot)
	if err != nil {
		t.Fatal(err)
	}
	behind := deliveredBelow(t, w.consumer, confirmed)
	var unmarked int
	if err := w.standby.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE id::text = ANY($1) AND published_at IS NULL`, behind).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != 0 {
		t.Fatalf("%d of the %d events below the slot's position %s are unmarked on the standby: the promotion leaves them behind the slot", unmarked, len(behind), confirmed)
	}
	// Delivered events whose marks the standby lacks: the slot must not
	// have passed them, and they are what the promotion puts at risk.
	var delivered []string
	for _, d := range w.consumer.Deliveries() {
		delivered = append(delivered, d.MessageID)
	}
	var atRisk int
	if err := w.standby.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE id::text = ANY($1) AND published_at IS NULL`, delivered).Scan(&atRisk); err != nil {
		t.Fatal(err)
	}
	if beforeKill != nil && atRisk == 0 {
		t.Fatal("no delivered event lacked its mark on the standby when the primary died: the frozen link tested nothing")
	}
	t.Logf("when the primary died: %d delivered events unmarked on the standby, all past the slot's position %s", atRisk, confirmed)
	if err := w.sb.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	before := prod.count()
	waitUntil(t, 60*time.Second, "the producer commits on the promoted standby", func() bool { return prod.count() >= before+300 })
	prod.halt()
	var rows []string
	if err := w.standby.QueryRow(ctx, `SELECT coalesce(array_agg(id::text), '{}') FROM event_outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitDelivered(t, w.consumer, rows, 60*time.Second, nil)
	waitUntil(t, 30*time.Second, "every row marked on the new primary", func() bool {
		var n int
		return w.standby.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&n) == nil && n == 0
	})
	have := make(map[string]bool, len(rows))
	for _, id := range rows {
		have[id] = true
	}
	seen := map[string]int{}
	phantoms, dups := 0, 0
	for _, d := range w.consumer.Deliveries() {
		if seen[d.MessageID]++; seen[d.MessageID] == 2 {
			dups++
		}
		if !have[d.MessageID] {
			phantoms++
		}
	}
	if phantoms != 0 {
		t.Errorf("%d deliveries of events the promoted standby does not have", phantoms)
	}
	if n := strings.Count(r.Logs.String(), "created replication slot"); n != 1 {
		t.Errorf("the relay created a slot %d times, want once: the promoted standby keeps it", n)
	}
	t.Logf("%d rows on the new primary, %d deliveries, %d duplicates, %d events confirmed on the standby when the primary died, all marked",
		len(rows), w.consumer.Count(), dups, len(behind))
}

// TestIntegrationStandbyCheck: check judges the standby of
// CDCRELAY_REPLICATION_URL and finds nothing wrong with this set-up, then
// names the missing grant once it is revoked.
func TestIntegrationStandbyCheck(t *testing.T) {
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
	cfg := relaytest.Config(t, relaytest.Vars(w.relayURL, w.amqpURL, w.exchange, map[string]string{"SLOT": standbySlot, "REPLICATION_URL": w.replURL}))
	judge := func() (errors []string, standby string) {
		for _, f := range preflight.Run(context.Background(), cfg, preflight.Options{}) {
			if f.Severity == preflight.Error {
				errors = append(errors, f.Check+": "+f.Message)
			}
			if f.Check == "replication server" {
				standby += f.Severity.String() + " " + f.Message + " " + f.Remedy + "\n"
			}
		}
		return errors, standby
	}
	errs, standby := judge()
	if len(errs) != 0 || !strings.Contains(standby, "OK") || !strings.Contains(standby, "is a standby of the primary") {
		t.Fatalf("errors %q; replication server findings:\n%s", errs, standby)
	}
	if _, err := w.primary.Exec(context.Background(), `REVOKE EXECUTE ON FUNCTION pg_log_standby_snapshot() FROM cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	if _, standby = judge(); !strings.Contains(standby, "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO cdcrelay_app") {
		t.Fatalf("without the grant, the findings do not name it:\n%s", standby)
	}
}

// TestIntegrationStandbySlotReplayDelayDegraded: the standby that holds the
// slot replays 30 s behind the primary (recovery_min_apply_delay). The
// events arrive once it has replayed them; their marks, written on the
// primary at once, then wait 30 s for the standby to replay them, and the
// slot may not pass them meanwhile: after 20 s of that /readyz says
// `streaming: degraded: marks waiting for …`. Once the delay is lifted the
// status is healthy again and every row is marked.
func TestIntegrationStandbySlotReplayDelayDegraded(t *testing.T) {
	t.Parallel()
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb_delay"})
	r := w.start(t, nil)
	ctx := context.Background()
	for _, q := range []string{`ALTER SYSTEM SET recovery_min_apply_delay = '30s'`, `SELECT pg_reload_conf()`} {
		if _, err := w.standby.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rows, _ := insertTxns(t, w.primary, "k", 3, 2)
	waitAll(t, w.consumer, rows, 90*time.Second)
	var status string
	waitUntil(t, 60*time.Second, "the status to say the marks wait", func() bool {
		status = r.Relay.Status()
		return strings.HasPrefix(status, "streaming: degraded: marks waiting for ") &&
			strings.Contains(status, "the standby that holds the slot (CDCRELAY_REPLICATION_URL) has not replayed the marks up to ")
	})
	t.Logf("status while the standby replays 30 s late: %s", status)
	for _, q := range []string{`ALTER SYSTEM RESET recovery_min_apply_delay`, `SELECT pg_reload_conf()`} {
		if _, err := w.standby.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 60*time.Second, "a healthy status", func() bool { return r.Relay.Status() == "streaming" })
	waitUntil(t, 60*time.Second, "every row marked on the primary", func() bool {
		var n int
		return w.primary.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&n) == nil && n == 0
	})
}
