//go:build pgmatrix

package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// This file needs PostgreSQL 17 or later (failover slots): make
// test-pg-matrix runs it (build tag pgmatrix) with CDCRELAY_PG_BIN set.

const failoverSlot = "cdcrelay_failover"

// multiHostURL is the relay role's URL reaching the primary first and the
// standby second, read-write only: after a promotion only the new primary
// qualifies.
func multiHostURL(t *testing.T, roleURL string, ports ...int) string {
	t.Helper()
	u, err := url.Parse(roleURL)
	if err != nil {
		t.Fatal(err)
	}
	hosts := make([]string, len(ports))
	for i, p := range ports {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	u.Host = strings.Join(hosts, ",")
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

// linkedStandby starts a standby of e's primary whose WAL link goes through
// a proxy the test can freeze, with settings added to its configuration.
// It returns the proxy, the standby and a new connection to the primary
// (StartStandby restarted it: the env's connection is gone).
func linkedStandby(t *testing.T, e *env, settings map[string]string) (*testenv.Proxy, *testenv.Postgres, *pgx.Conn) {
	t.Helper()
	link := testenv.MustProxy(t, "127.0.0.1:"+strconv.Itoa(e.pg.Port()))
	host, port, _ := strings.Cut(link.Addr(), ":")
	all := map[string]string{"primary_conninfo": "host=" + host + " port=" + port + " user=postgres dbname=postgres application_name=sb1"}
	for k, v := range settings {
		all[k] = v
	}
	sb := testenv.MustStandby(t, e.pg, testenv.StandbyOptions{Slot: "sb1", Settings: all})
	return link, sb, relaytest.Connect(t, e.dbURL)
}

// startFailoverRelay runs a relay on a multi-host URL reaching e's primary
// first and sb second, with quick retries and the given settings, until it
// streams.
func startFailoverRelay(t *testing.T, e *env, sb *testenv.Postgres, vars map[string]string) *relaytest.InProcess {
	t.Helper()
	all := map[string]string{"BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s", "MARK_INTERVAL": "50ms"}
	for k, v := range vars {
		all[k] = v
	}
	r := relaytest.Start(t, relaytest.Config(t, relaytest.Vars(multiHostURL(t, e.relayURL, e.pg.Port(), sb.Port()), e.amqpURL, e.exchange, all)),
		relaytest.InProcessOptions{LogTo: testWriter{t}})
	t.Cleanup(func() { _ = r.Stop() })
	r.WaitStreaming(t)
	return r
}

// waitSyncedSlot waits until the slot is a failover slot on the primary
// and the standby persists its synced copy: only then can a promotion keep
// it.
func waitSyncedSlot(t *testing.T, primary *pgx.Conn, sb *testenv.Postgres) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, 90*time.Second, "the standby holds a persistent synced copy of the failover slot", func() bool {
		_, fo, _, _, _, err := slotRow(ctx, primary, failoverSlot)
		if err != nil || !fo {
			return false
		}
		sdb, err := pgx.Connect(ctx, sb.URL("app"))
		if err != nil {
			return false
		}
		defer func() { _ = sdb.Close(ctx) }()
		exists, _, synced, temporary, _, err := slotRow(ctx, sdb, failoverSlot)
		return err == nil && exists && synced && !temporary
	})
}

// slotRow reads the slot's flags on a server.
func slotRow(ctx context.Context, db *pgx.Conn, name string) (exists, failover, synced, temporary bool, confirmed pglogrepl.LSN, err error) {
	var lsn *pglogrepl.LSN
	var fo, sy *bool // PostgreSQL 17+
	err = db.QueryRow(ctx, `SELECT (to_jsonb(s)->>'failover')::bool, (to_jsonb(s)->>'synced')::bool, temporary, confirmed_flush_lsn
		FROM pg_replication_slots s WHERE slot_name = $1`, name).
		Scan(&fo, &sy, &temporary, &lsn)
	failover, synced = fo != nil && *fo, sy != nil && *sy
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, false, false, 0, nil
	}
	if lsn != nil {
		confirmed = *lsn
	}
	return err == nil, failover, synced, temporary, confirmed, err
}

// producer inserts one-row transactions until stopped, on whichever
// server url reaches, and records the ids whose commit returned.
type producer struct {
	mu        sync.Mutex
	committed []string
	failed    int
	stop      chan struct{}
	done      chan struct{}
}

func startProducer(t *testing.T, dbURL string) *producer {
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var db *pgx.Conn
		defer func() {
			if db != nil {
				_ = db.Close(context.Background())
			}
		}()
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(4 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if db == nil || db.IsClosed() {
				var err error
				if db, err = pgx.Connect(ctx, dbURL); err != nil {
					db = nil
					cancel()
					p.note("", err)
					continue
				}
			}
			var id string
			err := db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('k', '{"event_type":"T"}') RETURNING id::text`).Scan(&id)
			cancel()
			p.note(id, err)
		}
	}()
	return p
}

func (p *producer) note(id string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.failed++
		return
	}
	p.committed = append(p.committed, id)
}

func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.committed)
}

func (p *producer) halt() []string {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.committed
}

// TestIntegrationFailoverSlotSurvivesPromotion: a primary with a standby
// that keeps failover slots in step (sync_replication_slots, and the
// primary's synchronized_standby_slots naming it). The relay, on a
// multi-host URL, turns its slot into a failover slot after the adoption.
// Under load the primary is killed (SIGKILL) and the standby promoted: the
// relay resumes from the synced slot without a new slot or a backfill;
// every row the new primary has is delivered and marked, no event is
// published for a transaction the new primary lacks, duplicates are only
// of events past the synced slot's position, and every event before that
// position was already marked on the standby when the primary died.
func TestIntegrationFailoverSlotSurvivesPromotion(t *testing.T) {
	failoverUnderLoad(t, false)
}

// TestIntegrationFailoverSlotFrozenLink: as above, but the standby's WAL
// link is frozen 1.5 s before the primary dies: the marks written
// meanwhile never reach it, and the synced slot must not have passed
// their rows.
func TestIntegrationFailoverSlotFrozenLink(t *testing.T) {
	failoverUnderLoad(t, true)
}

func failoverUnderLoad(t *testing.T, freeze bool) {
	testenv.RequireMajor(t, 17)
	ctx := context.Background()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	link, sb, primary := linkedStandby(t, e, map[string]string{"sync_replication_slots": "on"})
	if _, err := primary.Exec(ctx, `ALTER SYSTEM SET synchronized_standby_slots = 'sb1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	r := startFailoverRelay(t, e, sb, map[string]string{"SLOT": failoverSlot, "LOG_LEVEL": "debug"})
	// The slot becomes a failover slot after its (empty) adoption.
	waitSyncedSlot(t, primary, sb)

	prod := startProducer(t, multiHostURL(t, e.dbURL, e.pg.Port(), sb.Port()))
	waitUntil(t, 60*time.Second, "500 events delivered under load", func() bool { return e.consumer.Count() >= 500 })
	if freeze {
		link.HoldDownstream(true)
		time.Sleep(1500 * time.Millisecond)
	}
	if err := e.pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	sdb := relaytest.Connect(t, sb.URL("app"))
	// The standby replays what it received, then its synced slot's
	// position is final: events up to it were confirmed, so their rows
	// must be marked on the standby already (the janitor waited for it).
	var received pglogrepl.LSN
	if err := sdb.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn()`).Scan(&received); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitReplayed(ctx, received); err != nil {
		t.Fatal(err)
	}
	_, _, _, _, syncedAt, err := slotRow(ctx, sdb, failoverSlot)
	if err != nil {
		t.Fatal(err)
	}
	behind := deliveredBelow(t, e.consumer, syncedAt)
	var unmarked int
	if err := sdb.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE id::text = ANY($1) AND published_at IS NULL`, behind).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != 0 {
		t.Fatalf("%d of the %d events below the synced slot's position %s are unmarked on the standby: a promotion leaves them behind the slot", unmarked, len(behind), syncedAt)
	}
	if err := sb.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	before := prod.count()
	waitUntil(t, 60*time.Second, "the producer commits on the promoted standby", func() bool { return prod.count() >= before+300 })
	prod.halt()

	// Every row the new primary has is delivered and marked.
	var rows []string
	if err := sdb.QueryRow(ctx, `SELECT coalesce(array_agg(id::text), '{}') FROM event_outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitDelivered(t, e.consumer, rows, 60*time.Second, nil)
	waitUntil(t, 30*time.Second, "every row marked on the new primary", func() bool {
		var n int
		return sdb.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&n) == nil && n == 0
	})
	have := make(map[string]bool, len(rows))
	for _, id := range rows {
		have[id] = true
	}
	seen := map[string]int{}
	phantoms, dups, dupsBehind := 0, 0, 0
	for _, d := range e.consumer.Deliveries() {
		seen[d.MessageID]++
		if !have[d.MessageID] {
			phantoms++
		}
		if seen[d.MessageID] == 2 {
			dups++
			if relaytest.CommitLSN(t, e.consumer, d.MessageID) < syncedAt {
				dupsBehind++
			}
		}
	}
	if phantoms != 0 {
		t.Errorf("%d deliveries of events the new primary does not have (synchronized_standby_slots should hold them back)", phantoms)
	}
	if dupsBehind != 0 {
		t.Errorf("%d events below the synced slot's position %s were published again", dupsBehind, syncedAt)
	}
	if n := strings.Count(r.Logs.String(), "created replication slot"); n != 1 {
		t.Errorf("the relay created a slot %d times, want once (at the start): the failover must resume the synced slot", n)
	}
	if !strings.Contains(r.Logs.String(), "the server's timeline changed") {
		t.Error("the relay did not log the timeline change")
	}
	t.Logf("%d rows on the new primary, %d deliveries, %d duplicates (all past the synced position %s), %d events confirmed before the kill; producer commits lost by the failover itself (asynchronous standby) are not the relay's",
		len(rows), e.consumer.Count(), dups, syncedAt, len(behind))
}

// deliveredBelow lists the delivered events whose commit LSN is at or
// below lsn.
func deliveredBelow(t *testing.T, c *testenv.Consumer, lsn pglogrepl.LSN) []string {
	t.Helper()
	var ids []string
	for _, d := range c.Deliveries() {
		pos, err := relaytest.PositionOf(d)
		if err != nil {
			t.Fatal(err)
		}
		if pos.LSN < lsn {
			ids = append(ids, d.MessageID)
		}
	}
	return ids
}

// waitUntil polls cond every 100 ms until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: not yet %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIntegrationFailoverConvertsExistingSlot: a slot made without
// failover (CDCRELAY_SLOT_FAILOVER=off) becomes a failover slot when the
// next relay runs with auto, keeping its position: no new slot, no
// backfill, no event published twice. Back to off, it is converted back.
func TestIntegrationFailoverConvertsExistingSlot(t *testing.T) {
	testenv.RequireMajor(t, 17)
	ctx := context.Background()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	run := func(setting string, n int) *running {
		r := e.startRelay(map[string]string{"SLOT": failoverSlot, "SLOT_FAILOVER": setting})
		r.waitStreaming(t)
		rows, _ := insertTxns(t, e.db, "k", n)
		waitAll(t, e.consumer, rows, 30*time.Second)
		waitMarked(t, e, rows, 30*time.Second)
		return r
	}
	flags := func() bool {
		_, fo, _, _, _, err := slotRow(ctx, e.db, failoverSlot)
		if err != nil {
			t.Fatal(err)
		}
		return fo
	}
	r := run("off", 50)
	if flags() {
		t.Fatal("off made a failover slot")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = run("auto", 50)
	if !flags() {
		t.Fatal("auto did not turn failover on for the existing slot")
	}
	if strings.Contains(r.logs.String(), "created replication slot") {
		t.Error("auto created a new slot instead of converting the existing one")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = run("off", 50)
	if flags() {
		t.Error("off left the slot a failover slot")
	}
	if n, want := e.consumer.Count(), 150; n != want {
		t.Errorf("%d deliveries, want %d: a conversion must not publish anything again", n, want)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}
