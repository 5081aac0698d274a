package relay_test

import (
	"context"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// A test of invariant 10 (docs/architecture.md) against a database crash
// on a server whose commits are asynchronous: a mark the slot passed must
// survive the crash, so the janitor's own commits are durable whatever
// synchronous_commit the server, database or role sets.

// asyncSettings make every commit asynchronous unless its session says
// otherwise, and keep an asynchronous commit in shared memory for up to
// 10 s (the WAL writer's longest delay): a crash within that window loses
// it, as a machine's power cut would lose what the WAL writer wrote but did
// not fsync.
var asyncSettings = map[string]string{"synchronous_commit": "off", "wal_writer_delay": "10s"}

// durableRows is how many events the crash lands behind.
const durableRows = 50

// TestIntegrationMarksDurableUnderAsyncCommit: on a server with
// synchronous_commit=off the relay streams 50 rows, they are acknowledged,
// marked and passed by the slot, then PostgreSQL is killed (SIGKILL of
// every process) within the WAL writer's 10 s window, and restarted. While
// the relay is cut off (a proxy), every row must still be marked: the
// janitor's commits were flushed before their done let the slot pass. The
// relay then reconnects, and every row, old and new, ends marked.
func TestIntegrationMarksDurableUnderAsyncCommit(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	ctx := context.Background()
	e := newEnv(t, testenv.PostgresOptions{Settings: asyncSettings}, "#")
	syncSession(t, e.db) // the rows themselves must survive the crash
	link := testenv.MustProxy(t, "127.0.0.1:"+strconv.Itoa(e.pg.Port()))
	r := relaytest.Start(t, relaytest.Config(t, relaytest.Vars(viaProxy(t, e.relayURL, link.Addr()), e.amqpURL, e.exchange, map[string]string{
		"BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s", "MARK_INTERVAL": "50ms", "LOG_LEVEL": "debug",
	})), relaytest.InProcessOptions{LogTo: testWriter{t}})
	t.Cleanup(func() { _ = r.Stop() })
	r.WaitStreaming(t)
	warm := insertMarked(t, e, 5, 10*time.Second) // the janitor's connection is open

	awaitWALWriter(ctx, t, e.db)
	began := time.Now()
	rows, last := insertDelivered(t, e, durableRows)
	waitMarked(t, e, rows, 10*time.Second)
	testenv.WaitConfirmed(t, e.db, marksSlot, last, 10*time.Second)
	var written, inserted pglogrepl.LSN
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn(), pg_current_wal_insert_lsn()`).Scan(&written, &inserted); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 8*time.Second {
		t.Fatalf("the rows took %s to be marked and passed: the WAL writer (every 10 s) may have written the marks by itself, so the crash proves nothing", took.Round(time.Millisecond))
	}
	t.Logf("%d rows marked and passed by the slot (%s, past the rows' commit %s); WAL written up to %s, inserted up to %s",
		durableRows, testenv.ConfirmedFlush(t, e.db, marksSlot), last, written, inserted)

	link.Blackhole(true) // the relay must not mark anything again before the rows are counted
	if err := e.pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	restartPostgres(t, e)
	syncSession(t, e.db)
	all := slices.Concat(warm, rows)
	lost := unmarked(t, e, all)
	t.Logf("after the crash and recovery, before the relay reconnects: %d of %d acknowledged rows unmarked", lost, len(all))
	if lost != 0 {
		t.Errorf("%d of %d rows the slot had passed lost their marks in the crash: the janitor's commits were asynchronous (invariant 10, docs/architecture.md)", lost, len(all))
	}

	link.Reset() // the relay's connections died with the server
	link.Blackhole(false)
	more, _ := insertDelivered(t, e, 10)
	all = append(all, more...)
	deadline := time.Now().Add(30 * time.Second)
	for unmarked(t, e, all) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	left := unmarked(t, e, all)
	resumed := "none"
	if mf := testenv.Family(t, r.Reg, "cdcrelay_resumed_events_total"); mf != nil {
		resumed = strconv.FormatFloat(testenv.Value(mf.GetMetric()[0]), 'f', -1, 64)
	}
	t.Logf("after the relay reconnected: %d of %d rows unmarked; %d deliveries, events resumed (skipped as marked) %s",
		left, len(all), e.consumer.Count(), resumed)
	if left != 0 {
		t.Fatalf("%d of %d rows still unmarked 30 s after the relay reconnected", left, len(all))
	}
}

// syncSession makes db's commits synchronous whatever the server says.
func syncSession(t *testing.T, db *pgx.Conn) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
}

// awaitWALWriter returns just after the WAL writer wrote an asynchronous
// commit of db's (and with it any other WAL written before): its next turn
// is wal_writer_delay later, so what commits asynchronously in between
// exists only in shared memory until then (unless a full WAL page wakes
// it earlier, which writes the full pages only).
func awaitWALWriter(ctx context.Context, t *testing.T, db *pgx.Conn) {
	t.Helper()
	var lsn pglogrepl.LSN
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT txid_current()`) // a commit record, nothing else
		return err
	})
	if err == nil {
		err = db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&lsn)
	}
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var written bool
		if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn() >= $1`, lsn).Scan(&written); err != nil {
			t.Fatal(err)
		}
		if written {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the WAL writer did not write the asynchronous commit at %s within 15 s (wal_writer_delay is 10 s)", lsn)
		}
	}
}

// viaProxy is raw with its host and port replaced by addr.
func viaProxy(t *testing.T, raw, addr string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}
