package relay_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Tests of invariant 10, docs/architecture.md: the slot's confirmed
// position never passes an event whose row is not marked published_at, or
// parked, or gone.

const marksSlot = "cdcrelay_outbox"

// marksExec runs the test's own statements as the superuser.
func marksExec(t *testing.T, e *env, sql string) {
	t.Helper()
	if _, err := e.db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// marksRevokeSQL and marksGrantSQL take from and give back the relay role
// the right to mark rows.
const (
	marksRevokeSQL = `REVOKE UPDATE (published_at, attempts, last_error) ON event_outbox FROM cdcrelay_app`
	marksGrantSQL  = `GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO cdcrelay_app`
)

// marksDeliveredUnmarked counts delivered rows still unmarked.
func marksDeliveredUnmarked(t *testing.T, e *env) int {
	t.Helper()
	seen := map[string]bool{}
	var ids []string
	for _, d := range e.consumer.Deliveries() {
		if !seen[d.MessageID] {
			seen[d.MessageID] = true
			ids = append(ids, d.MessageID)
		}
	}
	var n int
	err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE id::text = ANY($1) AND published_at IS NULL`, ids).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIntegrationMarksSurviveSIGKILL kills the relay process (SIGKILL) at
// random points while a producer inserts 20,000 events, with a mark
// interval long enough that most kills land between broker acks and the
// janitor's flush. Every row ends marked and delivered (duplicates fine):
// the slot never passed the rows whose marks died with a process.
func TestIntegrationMarksSurviveSIGKILL(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	vars := map[string]string{"MARK_INTERVAL": "500ms", "MARK_BATCH": "5000", "STANDBY_RETRY": "200ms", "LOG_LEVEL": "info"}
	p := e.startProcess(vars)
	testenv.WaitSlotActive(t, e.db, marksSlot, 60*time.Second)

	const total, perTxn = 20000, 50
	produced := make(chan []row, 1)
	go func() {
		db := e.connect()
		var all []row
		for len(all) < total {
			rows, _, err := insert(context.Background(), db, "k", perTxn)
			all = append(all, rows...)
			if err != nil {
				t.Error(err)
				break
			}
			time.Sleep(25 * time.Millisecond) // a stream of about 15 s

		}
		produced <- all
	}()

	kills, atRisk := 0, 0
	var rows []row
	for deadline := time.Now().Add(60 * time.Second); rows == nil || kills < 5; {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %d kills, producer done: %v", kills, rows != nil)
		}
		before := e.consumer.Count()
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		select {
		case rows = <-produced:
		default:
		}
		if e.consumer.Count() == before || kills >= 8 {
			continue // not delivering: a kill now would test nothing
		}
		if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = p.Wait(t, 10*time.Second)
		kills++
		n := marksDeliveredUnmarked(t, e)
		atRisk += n
		t.Logf("kill %d: %d delivered rows unmarked when the process died", kills, n)
		p = e.startProcess(vars)
	}
	if len(rows) != total {
		t.Fatalf("producer inserted %d rows, want %d", len(rows), total)
	}
	waitAll(t, e.consumer, rows, 90*time.Second)
	took := waitMarked(t, e, rows, 30*time.Second)
	if atRisk == 0 {
		t.Fatal("no kill left a delivered row unmarked: the test proved nothing")
	}
	t.Logf("%d kills; %d delivered-but-unmarked rows at the kills; all %d rows marked (%s after the last delivery); %d deliveries (%d duplicates)",
		kills, atRisk, len(rows), took.Round(time.Millisecond), e.consumer.Count(), e.consumer.Count()-len(rows))
}

// TestIntegrationMarksBlockedThenRestored: the relay role loses UPDATE
// while events keep flowing. Delivery goes on, the slot's confirmed
// position stays before the unmarked rows, and once the grant is back
// every row is marked by the same relay, without a restart.
func TestIntegrationMarksBlockedThenRestored(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	insertMarked(t, e, 5, 10*time.Second)

	marksExec(t, e, marksRevokeSQL)
	denied := gauge(t, r.reg, "cdcrelay_janitor_errors_total")
	blocked, _ := insertDelivered(t, e, 10, 10, 10)
	more, last := insertDelivered(t, e, 20) // delivery goes on
	// Many status updates and mark attempts, counted: the slot check below
	// proves nothing unless the relay tried to mark and reported positions.
	waitCounter(t, r.reg, "cdcrelay_janitor_errors_total", denied+3, 30*time.Second)
	liveFor(t, r, 2*time.Second)
	all := slices.Concat(blocked, more)
	if n := unmarked(t, e, all); n != len(all) {
		t.Fatalf("%d rows marked without the grant", len(all)-n)
	}
	first := marksCommitLSN(t, e, blocked[0].id)
	if got := testenv.ConfirmedFlush(t, e.db, marksSlot); got > first {
		t.Fatalf("slot confirmed %s, past the commit %s of unmarked rows", got, first)
	} else {
		t.Logf("while blocked: slot confirmed %s, first unmarked commit at %s", got, first)
	}
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay stopped: %v", err)
	}

	marksExec(t, e, marksGrantSQL)
	took := waitMarked(t, e, all, 15*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 15*time.Second)
	t.Logf("all %d rows marked %s after the grant came back; the slot then passed them", len(all), took.Round(time.Millisecond))
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay restarted or stopped: %v", err)
	}
}

// TestIntegrationMarksPoisonWithoutParkGrant: the role lacks UPDATE
// (attempts, last_error); a poison row (routing key over 255 bytes) is
// parked unrecorded, reported once, and the good rows after it are marked
// within seconds; the slot passes the poison row.
func TestIntegrationMarksPoisonWithoutParkGrant(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	marksExec(t, e, `REVOKE UPDATE (attempts, last_error) ON event_outbox FROM cdcrelay_app`)
	r := e.startRelay(map[string]string{"MARK_INTERVAL": "100ms", "STATUS_INTERVAL": statusesFast.String()})
	r.waitStreaming(t)
	marksExec(t, e, `INSERT INTO event_outbox (routing_key, payload) VALUES ('`+strings.Repeat("r", 300)+`', '{"event_type":"TestEvent"}')`)
	good, last := insertDelivered(t, e, 10, 10)
	took := waitMarked(t, e, good, 5*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 10*time.Second)
	// Ten more mark intervals on the relay's clock, and the janitor seen
	// writing again (another batch marked): no more reports.
	liveFor(t, r, time.Second)
	again, _ := insertDelivered(t, e, 10)
	waitMarked(t, e, again, 5*time.Second)
	reports := strings.Count(r.logs.String(), "cannot record parked poison events")
	unrecorded := gauge(t, r.reg, "cdcrelay_janitor_park_unrecorded_total")
	errs := gauge(t, r.reg, "cdcrelay_janitor_errors_total")
	t.Logf("good rows marked %s after delivery; %d report(s), %v unrecorded park(s), %v janitor errors", took.Round(time.Millisecond), reports, unrecorded, errs)
	if reports != 1 || unrecorded != 1 || errs != 0 {
		t.Fatalf("%d reports, %v unrecorded parks, %v janitor errors; want 1, 1, 0", reports, unrecorded, errs)
	}
	var poisonUnpublished int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE length(routing_key) = 300 AND published_at IS NULL AND attempts = 0`).Scan(&poisonUnpublished); err != nil || poisonUnpublished != 1 {
		t.Fatalf("poison row: %d unpublished unrecorded (%v), want 1", poisonUnpublished, err)
	}
}

// TestIntegrationMarksPostgresStopped: PostgreSQL is down (crashed) for 10 s while
// the janitor has marks to write (the grant is revoked first so they stay
// queued). Its connection attempts follow the backoff schedule (capped at
// BACKOFF_MAX=1s here), not one per mark interval; afterwards every row is
// marked.
func TestIntegrationMarksPostgresStopped(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms"})
	ctx := context.Background()
	marksExec(t, e, marksRevokeSQL)
	rows, _ := insertDelivered(t, e, 20, 20)
	// A crash: the server is down, not shutting down, for the whole 10 s
	// (a fast stop ends the session at once: pgstop_test.go).
	if err := e.pg.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	before := gauge(t, r.reg, "cdcrelay_janitor_connects_total")
	time.Sleep(10 * time.Second)
	attempts := gauge(t, r.reg, "cdcrelay_janitor_connects_total") - before
	restartPostgres(t, e)
	marksExec(t, e, marksGrantSQL)
	after, _ := insertTxns(t, e.db, "k", 20)
	waitAll(t, e.consumer, after, 60*time.Second)
	took := waitMarked(t, e, append(rows, after...), 30*time.Second)
	// Backoff 100 ms doubling to 1 s, each wait jittered to at least half:
	// at most 20 attempts in 10 s (one per mark interval would be 100).
	t.Logf("janitor connection attempts in 10 s with PostgreSQL down: %v; all rows marked %s after restart", attempts, took.Round(time.Millisecond))
	if attempts < 3 || attempts > 22 {
		t.Fatalf("%v janitor connection attempts in 10 s, want 3..22 (the backoff schedule)", attempts)
	}
}

// TestIntegrationMarksAfterIDTypeChange: after ALTER COLUMN id TYPE the
// janitor rebuilds its statements (they cast to the id column's type) and
// marks new rows without a restart.
func TestIntegrationMarksAfterIDTypeChange(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms"})
	insertMarked(t, e, 5, 10*time.Second)
	marksExec(t, e, `ALTER TABLE event_outbox ALTER COLUMN id TYPE text`)
	insertDelivered(t, e, 5)
	start := time.Now()
	for marksDeliveredUnmarked(t, e) > 0 { // unmarked casts to uuid: not any more
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d delivered rows unmarked 10 s after the id type change", marksDeliveredUnmarked(t, e))
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("rows after the type change marked %s after delivery", took.Round(time.Millisecond))
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay stopped: %v", err)
	}
}

// TestIntegrationMarksLatencyFigures measures, one single-row transaction
// at a time, the commit-to-consumer latency and the time until the slot's
// confirmed position passes the commit (docs/performance.md). It asserts
// only that every row is delivered, marked and confirmed; the figures are
// logged.
func TestIntegrationMarksLatencyFigures(t *testing.T) {
	e, _ := streamingRelay(t, map[string]string{"MARK_INTERVAL": "100ms", "LOG_LEVEL": "info"})
	const n = 40
	var deliver, confirm []time.Duration
	var all []row
	for i := range n {
		rows, last := insertTxns(t, e.db, "k", 1)
		committed := time.Now()
		all = append(all, rows...)
		testenv.WaitCount(t, e.consumer, i+1, 30*time.Second)
		deliver = append(deliver, e.consumer.Deliveries()[i].ReceivedAt.Sub(committed))
		for testenv.ConfirmedFlush(t, e.db, marksSlot) <= last {
			if time.Since(committed) > 30*time.Second {
				t.Fatalf("slot not past transaction %d after 30 s", i)
			}
			time.Sleep(2 * time.Millisecond)
		}
		confirm = append(confirm, time.Since(committed))
	}
	if u := unmarked(t, e, all); u != 0 {
		t.Fatalf("%d rows unmarked after the slot passed them", u)
	}
	q := func(d []time.Duration, p float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		slices.Sort(s)
		return s[int(p*float64(len(s)-1))].Round(time.Millisecond)
	}
	t.Logf("%d single-row transactions one at a time: commit->consumer p50 %s max %s; commit->slot confirmed p50 %s max %s",
		n, q(deliver, 0.5), q(deliver, 1), q(confirm, 0.5), q(confirm, 1))

	steady := marksSteadyConfirmLag(t, e, 5*time.Second, 10*time.Millisecond)
	t.Logf("%d single-row transactions at 100/s: commit->slot confirmed p50 %s p99 %s max %s",
		len(steady), q(steady, 0.5), q(steady, 0.99), q(steady, 1))
}

// marksSteadyConfirmLag commits one single-row transaction every gap for
// d while sampling the slot's confirmed position, and returns, per
// transaction, the time from its commit until the slot passed it.
func marksSteadyConfirmLag(t *testing.T, e *env, d, gap time.Duration) []time.Duration {
	t.Helper()
	type sample struct {
		at  time.Time
		lsn pglogrepl.LSN
	}
	type txn struct {
		at   time.Time
		last pglogrepl.LSN
	}
	var samples []sample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		db := e.connect()
		for {
			var lsn pglogrepl.LSN
			err := db.QueryRow(context.Background(), `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, marksSlot).Scan(&lsn)
			if err != nil {
				t.Errorf("sample the slot: %v", err)
				return
			}
			samples = append(samples, sample{time.Now(), lsn})
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var txns []txn
	var rows []row
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(gap) {
		r, last := insertTxns(t, e.db, "k", 1)
		txns = append(txns, txn{time.Now(), last})
		rows = append(rows, r...)
	}
	waitAll(t, e.consumer, rows, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, txns[len(txns)-1].last+1, 30*time.Second)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	<-sampled
	lags := make([]time.Duration, 0, len(txns))
	i := 0
	for _, x := range txns {
		for i < len(samples) && samples[i].lsn <= x.last {
			i++
		}
		if i == len(samples) {
			t.Fatalf("no sample saw the slot pass %s", x.last)
		}
		lags = append(lags, max(samples[i].at.Sub(x.at), 0))
	}
	return lags
}

// TestIntegrationMarksGracefulStop: with a long mark interval, a graceful
// stop right after delivery still ends with every row marked and the slot
// past them: the drain asks the janitor to write at once and the final
// status update carries the marks written meanwhile.
func TestIntegrationMarksGracefulStop(t *testing.T) {
	e, r := streamingRelay(t, map[string]string{"MARK_INTERVAL": "5s", "MARK_BATCH": "100000"})
	rows, last := insertDelivered(t, e, 100, 100)
	began := time.Now()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if u := unmarked(t, e, rows); u != 0 {
		t.Fatalf("%d rows unmarked after a graceful stop", u)
	}
	// The final status update went out before the stop returned; the
	// walsender applies it when it reads it, a moment later on a busy
	// machine, so the slot is read until it shows it (or 10 s pass).
	testenv.WaitConfirmed(t, e.db, marksSlot, last+1, 10*time.Second)
	t.Logf("graceful stop took %s; all rows marked and confirmed", took.Round(time.Millisecond))
}

// TestIntegrationMarksStandbyJanitorIdle: a hot standby's janitor has
// nothing to mark, so it never connects, while the streaming relay marks.
func TestIntegrationMarksStandbyJanitorIdle(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	a := e.startRelay(map[string]string{"MARK_INTERVAL": "20ms", "STATUS_INTERVAL": statusesFast.String()})
	a.waitStreaming(t)
	b := e.startRelay(map[string]string{"MARK_INTERVAL": "20ms", "STANDBY_RETRY": "200ms"})
	b.WaitFor(t, 30*time.Second, "standby", func() bool { return b.relay.Role() == relay.RoleStandby })
	insertMarked(t, e, 20, 10*time.Second)
	// 50 mark ticks on the standby, clocked by the streaming relay's
	// status updates (same process; a standby exports no counter that
	// moves while it waits).
	liveFor(t, a, time.Second)
	if n := gauge(t, b.reg, "cdcrelay_janitor_connects_total"); n != 0 {
		t.Fatalf("the standby's janitor made %v connection attempts", n)
	}
	if n := gauge(t, a.reg, "cdcrelay_janitor_connects_total"); n < 1 {
		t.Fatalf("the streaming relay's janitor never connected (%v) yet rows are marked", n)
	}
}
