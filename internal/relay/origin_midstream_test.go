//go:build pgmatrix

package relay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// This file needs PostgreSQL 16 or later (pgoutput's origin option): make
// test-pg-matrix runs it (build tag pgmatrix). It is the audit's h44: a
// replication origin created while a session streams with origin 'none'
// (docs/configuration.md, "Marks the walsender does not decode").

// midStreamOrigin is the foreign origin the tests create, as CREATE
// SUBSCRIPTION would create pg_<oid>.
const midStreamOrigin = "hq44_sub"

// foreignRow is an outbox row written under midStreamOrigin, and a WAL
// position read after its transaction committed: a confirmed position at
// or past it has passed the row.
type foreignRow struct {
	row
	after pglogrepl.LSN
}

// slotWatch samples the slot's confirmed position against the foreign
// rows written so far, and remembers the first time it found the slot
// past one whose row was not marked yet: the slot had passed an event the
// relay had not published (invariant 10, docs/architecture.md).
type slotWatch struct {
	slot      string
	mu        sync.Mutex
	rows      []foreignRow
	violation string
	samples   int
	stop      chan struct{}
	done      chan struct{}
}

// watchSlot watches slot on the server at url, which holds it: the marks
// are read there too, since the slot passes a row only once its mark is
// there (invariant 10, docs/architecture.md).
func watchSlot(t *testing.T, url, slot string) *slotWatch {
	t.Helper()
	db := relaytest.Connect(t, url)
	w := &slotWatch{slot: slot, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if err := w.sample(db); err != nil {
				w.mu.Lock()
				if w.violation == "" {
					w.violation = "sampling failed: " + err.Error()
				}
				w.mu.Unlock()
				return
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

// sample reads the slot first and the marks second: a row unmarked now
// was unmarked when the slot was read, and the slot never goes back.
func (w *slotWatch) sample(db *pgx.Conn) error {
	ctx := context.Background()
	w.mu.Lock()
	rows := slices.Clone(w.rows)
	w.mu.Unlock()
	var confirmed *pglogrepl.LSN
	if err := db.QueryRow(ctx, `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, w.slot).Scan(&confirmed); err != nil {
		return err
	}
	var passed []string
	for _, r := range rows {
		if confirmed != nil && *confirmed >= r.after {
			passed = append(passed, r.id)
		}
	}
	var unmarked []string
	if len(passed) > 0 {
		err := db.QueryRow(ctx, `SELECT coalesce(array_agg(id::text), '{}') FROM event_outbox WHERE id = ANY($1::uuid[]) AND published_at IS NULL`, passed).Scan(&unmarked)
		if err != nil {
			return err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	if len(unmarked) > 0 && w.violation == "" {
		w.violation = fmt.Sprintf("the slot's confirmed_flush_lsn %s passed %d row(s) written under %s before they were marked, e.g. %s", *confirmed, len(unmarked), midStreamOrigin, unmarked[0])
	}
	return nil
}

func (w *slotWatch) add(r foreignRow) {
	w.mu.Lock()
	w.rows = append(w.rows, r)
	w.mu.Unlock()
}

func (w *slotWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// currentLSN reads the primary's WAL position: after a commit, at or
// past the end of its commit record.
func currentLSN(t *testing.T, db *pgx.Conn) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	if err := db.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// midStream is where h44 runs: the relay's settings, and the server that
// holds its slot (the primary, or a standby), as a superuser.
type midStream struct {
	vars    map[string]string
	slot    string
	slotURL string
}

// originCreatedMidStream is h44 against a relay that streams with origin
// 'none': after the session started, midStreamOrigin is created, ten
// one-row transactions are written under it by another session, and five
// plain ones between them. Every row must be delivered and marked, and
// the slot must never pass a foreign row before it is marked.
func originCreatedMidStream(t *testing.T, e *env, m midStream) {
	ctx := context.Background()
	m.vars["SLOT"], m.vars["STATUS_INTERVAL"] = m.slot, "2s"
	r := e.startRelay(m.vars)
	r.waitStreaming(t)
	if !strings.Contains(r.logs.String(), "origin 'none'") {
		t.Fatal("the session does not stream with origin 'none': the test would test nothing")
	}
	slotDB := relaytest.Connect(t, m.slotURL)
	// The gate holds the slot back about one status interval at most
	// behind what is marked, when nothing foreign appears.
	before, _ := insertTxns(t, e.db, "plain", 1, 1, 1)
	waitMarked(t, e, before, 30*time.Second)
	testenv.WaitConfirmed(t, slotDB, m.slot, currentLSN(t, e.db), 2*time.Second+5*time.Second)

	if _, err := e.db.Exec(ctx, `SELECT pg_replication_origin_create($1)`, midStreamOrigin); err != nil {
		t.Fatal(err)
	}
	watch := watchSlot(t, m.slotURL, m.slot)
	applier := e.connect()
	if _, err := applier.Exec(ctx, `SELECT pg_replication_origin_session_setup($1)`, midStreamOrigin); err != nil {
		t.Fatal(err)
	}
	var foreign []foreignRow
	plain := before
	for i := range 10 {
		rows, _ := insertTxns(t, applier, "foreign", 1)
		f := foreignRow{row: rows[0], after: currentLSN(t, applier)}
		foreign = append(foreign, f)
		watch.add(f)
		if i%2 == 1 {
			rows, _ := insertTxns(t, e.db, "plain", 1)
			plain = append(plain, rows...)
		}
	}
	all := slices.Clone(plain)
	for _, f := range foreign {
		all = append(all, f.row)
	}
	if lost := waitDelivered(e, all, 60*time.Second); len(lost) > 0 {
		var lostForeign int
		for _, f := range foreign {
			if slices.Contains(lost, f.id) {
				lostForeign++
			}
		}
		t.Fatalf("%d of %d rows written under %s never delivered, %d of %d plain rows; %d of the foreign rows unmarked; the slot at %s, the first foreign row's commit before %s",
			lostForeign, len(foreign), midStreamOrigin, len(lost)-lostForeign, len(plain), unmarked(t, e, foreignRows(foreign)),
			testenv.ConfirmedFlush(t, slotDB, m.slot), foreign[0].after)
	}
	waitMarked(t, e, all, 30*time.Second)
	testenv.WaitConfirmed(t, slotDB, m.slot, foreign[len(foreign)-1].after, 30*time.Second)
	watch.end()
	if watch.violation != "" {
		t.Error(watch.violation)
	}
	if !strings.Contains(r.logs.String(), midStreamOrigin) {
		t.Errorf("the relay never named the origin %s", midStreamOrigin)
	}
	t.Logf("%d rows under %s and %d plain rows: all delivered (%d deliveries) and marked; the slot never passed an unmarked foreign row (%d samples)",
		len(foreign), midStreamOrigin, len(plain), e.consumer.Count(), watch.samples)
}

func foreignRows(fs []foreignRow) []row {
	rows := make([]row, len(fs))
	for i, f := range fs {
		rows[i] = f.row
	}
	return rows
}

// waitDelivered waits until every row has reached the consumer, and
// returns the ids of those that did not within.
func waitDelivered(e *env, rows []row, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		seen := make(map[string]bool)
		for _, d := range e.consumer.Deliveries() {
			seen[d.MessageID] = true
		}
		var lost []string
		for _, r := range rows {
			if !seen[r.id] {
				lost = append(lost, r.id)
			}
		}
		if len(lost) == 0 || time.Now().After(deadline) {
			return lost
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationMarkOriginCreatedMidStream: the audit's h44. A relay
// streams with origin 'none'; a replication origin that is not a relay's
// is created afterwards and outbox rows are written under it. Every one
// is delivered and marked, and the slot never passes one first: as a
// superuser (the relay also reads the origins' shared-memory state), as
// the least-privilege role with the three origin grants (the catalog
// only), and with the slot on a standby (the checks run there).
func TestIntegrationMarkOriginCreatedMidStream(t *testing.T) {
	testenv.RequireMajor(t, 16)
	t.Run("superuser", func(t *testing.T) {
		e := newEnv(t, testenv.PostgresOptions{}, "#")
		originCreatedMidStream(t, e, midStream{vars: map[string]string{"DATABASE_URL": e.dbURL}, slot: originSlot, slotURL: e.dbURL})
	})
	t.Run("origin grants", func(t *testing.T) {
		e := newEnv(t, testenv.PostgresOptions{}, "#")
		grantOrigins(t, e.db)
		originCreatedMidStream(t, e, midStream{vars: map[string]string{}, slot: originSlot, slotURL: e.dbURL})
	})
	t.Run("slot on a standby", func(t *testing.T) {
		w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
		w.db = w.primary // the standby's creation restarted the primary
		grantOrigins(t, w.db)
		if _, err := w.db.Exec(context.Background(), `GRANT EXECUTE ON FUNCTION pg_show_replication_origin_status() TO cdcrelay_app`); err != nil {
			t.Fatal(err)
		}
		originCreatedMidStream(t, w.env, midStream{
			vars: map[string]string{"DATABASE_URL": w.relayURL, "REPLICATION_URL": w.replURL, "MARK_INTERVAL": "50ms"},
			slot: standbySlot, slotURL: w.sb.URL("app"),
		})
	})
}

// TestIntegrationMarkOriginCheckSeesUncommittedOrigin: an origin created
// and set up in a transaction that has not committed (as one waiting for
// a synchronous standby has not become visible) is absent from
// pg_replication_origin but present in the shared-memory state, without a
// name: the check counts it as foreign where it may read that state, and
// cannot see it where it may not (the limit docs/configuration.md states).
func TestIntegrationMarkOriginCheckSeesUncommittedOrigin(t *testing.T) {
	testenv.RequireMajor(t, 16)
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	grantOrigins(t, e.db)
	ctx := context.Background()
	tx, err := e.connect().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_replication_origin_create('uncommitted_origin'); SELECT pg_replication_origin_session_setup('uncommitted_origin')`); err != nil {
		t.Fatal(err)
	}
	if _, err := relaytest.Insert(ctx, tx, "k", 1); err != nil {
		t.Fatal(err)
	}
	super := e.connect()
	status, err := pgconnect.ReadsOriginStatus(ctx, super)
	if err != nil || !status {
		t.Fatalf("a superuser reads the origins' status: %v, %v", status, err)
	}
	foreign, err := pgconnect.ForeignOrigins(ctx, super, true)
	if err != nil || len(foreign) != 1 || !strings.Contains(foreign[0], "not visible") {
		t.Fatalf("with the status: foreign origins %q, %v; want the uncommitted one, unnamed", foreign, err)
	}
	relayDB := relaytest.Connect(t, e.relayURL)
	if status, err := pgconnect.ReadsOriginStatus(ctx, relayDB); err != nil || status {
		t.Fatalf("the least-privilege role reads the origins' status: %v, %v; want false", status, err)
	}
	if foreign, err := pgconnect.ForeignOrigins(ctx, relayDB, false); err != nil || len(foreign) != 0 {
		t.Fatalf("from the catalog alone: foreign origins %q, %v; want none visible", foreign, err)
	}
	if _, err := e.db.Exec(ctx, `GRANT EXECUTE ON FUNCTION pg_show_replication_origin_status() TO cdcrelay_app`); err != nil {
		t.Fatal(err)
	}
	if status, err := pgconnect.ReadsOriginStatus(ctx, relayDB); err != nil || !status {
		t.Fatalf("the role with the grant reads the origins' status: %v, %v", status, err)
	}
	if foreign, err := pgconnect.ForeignOrigins(ctx, relayDB, true); err != nil || len(foreign) != 1 {
		t.Fatalf("the role with the grant: foreign origins %q, %v; want the uncommitted one", foreign, err)
	}
}
