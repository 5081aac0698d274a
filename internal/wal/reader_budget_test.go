package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// budgetMarks is a Positions that records nothing of interest.
type budgetMarks struct{ seq atomic.Uint64 }

func (m *budgetMarks) Begin()                  {}
func (m *budgetMarks) NextSeq() uint64         { return m.seq.Add(1) }
func (m *budgetMarks) Commit(pglogrepl.LSN)    {}
func (m *budgetMarks) Keepalive(pglogrepl.LSN) {}
func (m *budgetMarks) Position() pglogrepl.LSN { return 0 }

// budgetServer is a fake walsender on a loopback socket: it streams the
// given pgoutput messages as XLogData and counts the status updates it
// receives.
type budgetServer struct {
	statuses atomic.Int64
}

func (s *budgetServer) serve(t testing.TB, conn net.Conn, msgs [][]byte) {
	backend := pgproto3.NewBackend(conn, conn)
	go func() {
		for {
			m, err := backend.Receive()
			if err != nil {
				return
			}
			if cd, ok := m.(*pgproto3.CopyData); ok && len(cd.Data) > 0 && cd.Data[0] == pglogrepl.StandbyStatusUpdateByteID {
				s.statuses.Add(1)
			}
		}
	}()
	for i, m := range msgs {
		x := []byte{pglogrepl.XLogDataByteID}
		x = binary.BigEndian.AppendUint64(x, uint64(i+1))
		x = binary.BigEndian.AppendUint64(x, uint64(i+1))
		x = binary.BigEndian.AppendUint64(x, 0)
		backend.Send(&pgproto3.CopyData{Data: append(x, m...)})
		if err := backend.Flush(); err != nil {
			t.Logf("fake walsender: %v", err)
			return
		}
	}
}

// budgetConn returns a replication connection to a fake walsender that
// streams msgs. The two ends are a net.Pipe, in memory: inside a
// synctest bubble its reads, writes and deadlines run on the bubble's
// clock, so a test can wait for the reader to block instead of sleeping.
func budgetConn(t testing.TB, msgs [][]byte) (*pgconn.PgConn, *budgetServer) {
	t.Helper()
	client, server := net.Pipe()
	t.Cleanup(func() { _ = server.Close() })
	srv := &budgetServer{}
	go srv.serve(t, server, msgs)
	cfg, err := pgconn.ParseConfig("postgres://u@127.0.0.1:5432/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	// A receive that times out must leave the connection usable, as a
	// real replication connection's does; no cancel requests to a fake.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{
		Conn: client, PID: 1, TxStatus: 'I', Config: cfg, ParameterStatuses: map[string]string{},
		Frontend: pgproto3.NewFrontend(client, client),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, srv
}

// budgetReader is a Reader of the outbox on conn that holds at most
// budget bytes of events (sem) before they are sent on out.
func budgetReader(conn *pgconn.PgConn, sem *semaphore.Weighted, budget int64, out chan Event, stop chan struct{}) *Reader {
	return NewReader(conn, ReaderConfig{
		Decoder:   NewDecoder(Mapping{Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload"}}),
		Positions: &budgetMarks{}, Out: out, Budget: sem, BudgetBytes: budget,
		StatusInterval: 100 * time.Millisecond, SoftStop: stop, Settled: make(chan struct{}),
		Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), ""),
	})
}

// TestReaderHoldsNoMoreThanTheBudget: with nobody taking events, the
// reader sends no more decoded bytes into Out than the budget allows
// (whatever room Out has) and keeps sending status updates while it waits;
// as the consumer gives bytes back, every event comes through, and the
// bytes sent and not given back never exceed the budget. It runs in a
// synctest bubble: the 1.5 s wait is on the bubble's clock, and
// synctest.Wait returns once the reader is blocked, so the count held is
// the reader's last word, not a guess at how far a loaded machine got.
func TestReaderHoldsNoMoreThanTheBudget(t *testing.T) {
	synctest.Test(t, readerHoldsNoMoreThanTheBudget)
}

func readerHoldsNoMoreThanTheBudget(t *testing.T) {
	const (
		events  = 40
		payload = 10 << 10
		budget  = 32 << 10 // room for 3 events of ~10 KiB, not 4
	)
	body := `"` + strings.Repeat("p", payload-2) + `"`
	msgs := [][]byte{encRelation(1, "public", "event_outbox", "id", "routing_key", "payload"), encBegin(100, 7)}
	for i := range events {
		msgs = append(msgs, encInsert(1, s(string(rune('a'+i%26))+"-id"), s("k"), s(body)))
	}
	msgs = append(msgs, encCommit(100, 101))
	conn, srv := budgetConn(t, msgs)

	sem := semaphore.NewWeighted(budget)
	out := make(chan Event, 256) // like the relay's: room is not the bound
	stop := make(chan struct{})
	r := budgetReader(conn, sem, budget, out, stop)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	var runErr error
	go func() { defer wg.Done(); runErr = r.Run(ctx) }()

	// Nobody takes events: the reader must stop at the budget.
	time.Sleep(1500 * time.Millisecond)
	synctest.Wait()
	weight := int64(0)
	held := len(out)
	for range held {
		ev := <-out
		weight += ev.Weight(budget)
		out <- ev // put back in order for the drain below
	}
	// (the loop above only looks: the bytes are still taken)
	if weight > budget || held != 3 {
		t.Fatalf("%d events (%d bytes) waiting in Out with a budget of %d bytes", held, weight, budget)
	}
	if n := srv.statuses.Load(); n < 3 {
		t.Fatalf("%d status updates while the reader waited 1.5s for budget (interval 100ms)", n)
	}

	// Give bytes back one event at a time: everything comes through, and
	// sent-but-not-given-back never exceeds the budget.
	outstanding := weight
	for got := 0; got < events; got++ {
		var ev Event
		select {
		case ev = <-out:
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d of %d never came", got+1, events)
		}
		if len(ev.Payload) != payload {
			t.Fatalf("event %d payload %d bytes", got, len(ev.Payload))
		}
		if got >= held { // the ones held before were counted already
			outstanding += ev.Weight(budget)
		}
		if outstanding > budget {
			t.Fatalf("%d bytes sent and not given back, budget %d", outstanding, budget)
		}
		sem.Release(ev.Weight(budget))
		outstanding -= ev.Weight(budget)
	}
	close(stop)
	cancel()
	wg.Wait()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		t.Fatalf("reader: %v", runErr)
	}
}

// TestReaderBudgetBigEvent: an event larger than the whole budget takes
// all of it and goes alone. Each "nothing else was sent" window is on a
// synctest bubble's clock and counts only once the reader is seen to have
// lived through it: status updates kept coming while it waited.
func TestReaderBudgetBigEvent(t *testing.T) {
	synctest.Test(t, readerBudgetBigEvent)
}

func readerBudgetBigEvent(t *testing.T) {
	const budget = 4 << 10
	big := `"` + strings.Repeat("b", 3*budget) + `"`
	msgs := [][]byte{encRelation(1, "public", "event_outbox", "id", "routing_key", "payload"), encBegin(100, 7),
		encInsert(1, s("small-1"), s("k"), s(`{}`)),
		encInsert(1, s("big"), s("k"), s(big)),
		encInsert(1, s("small-2"), s("k"), s(`{}`)),
		encCommit(100, 101)}
	conn, srv := budgetConn(t, msgs)
	sem := semaphore.NewWeighted(budget)
	out := make(chan Event, 16)
	stop := make(chan struct{})
	r := budgetReader(conn, sem, budget, out, stop)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { close(stop); cancel(); <-done }()

	next := func() Event {
		t.Helper()
		select {
		case ev := <-out:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
			return Event{}
		}
	}
	first := next()
	waitWindow(t, srv)
	if len(out) != 0 {
		t.Fatalf("the big event was sent while %s still held bytes", first.ID)
	}
	sem.Release(first.Weight(budget))
	bigEv := next()
	if bigEv.ID != "big" || bigEv.Weight(budget) != budget {
		t.Fatalf("got %s weighing %d", bigEv.ID, bigEv.Weight(budget))
	}
	waitWindow(t, srv)
	if len(out) != 0 {
		t.Fatal("an event was sent alongside the one that took the whole budget")
	}
	sem.Release(budget)
	if ev := next(); ev.ID != "small-2" {
		t.Fatalf("got %s", ev.ID)
	}
}

// waitWindow lets 500 ms of the bubble's clock pass and waits for the
// reader to block, then fails unless the reader sent a status update after
// each of its two 200 ms turns of waiting for budget (progressDelay): the
// evidence that it ran through the window a "nothing was sent" check is
// about.
func waitWindow(t *testing.T, srv *budgetServer) {
	t.Helper()
	before := srv.statuses.Load()
	time.Sleep(500 * time.Millisecond)
	synctest.Wait()
	if n := srv.statuses.Load() - before; n < 2 {
		t.Fatalf("%d status updates in a 500ms window (one per 200ms turn of waiting): the reader did not run through it", n)
	}
}
