package janitor

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// oneTxn is a watermark at 100 with one transaction of two events ending
// at 200.
func oneTxn() (*progress.Watermark, uint64, uint64) {
	w := progress.NewWatermark(100)
	w.Begin()
	a, b := w.NextSeq(), w.NextSeq()
	w.Commit(200)
	return w, a, b
}

func ref(seq uint64, id string) publish.Ref {
	return publish.Ref{Seq: seq, ID: id, At: wal.Place{CommitLSN: 150, Index: int(seq)}}
}

// settleMark and settleParked do what a flush does once the i-th queued
// row is marked or recorded.
func settleMark(j *Janitor, i int) {
	j.mu.Lock()
	done := j.pending[i].done
	j.mu.Unlock()
	done()
}

func settleParked(j *Janitor, i int) {
	j.mu.Lock()
	done := j.parked[i].done
	j.mu.Unlock()
	done()
}

func openEvents(s *Marks) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// TestSessionWaitsForMarks: a broker ack alone does not move the
// watermark; the row's settling does, once per event however often it is
// called. Parked events count only once recorded, too.
func TestSessionWaitsForMarks(t *testing.T) {
	w, s0, s1 := oneTxn()
	j := newTest(10)
	s := j.Marks(context.Background(), w)
	s.Ack(ref(s0, "a"))
	s.Parked(ref(s1, "b"), "poison")
	if got := w.Position(); got != 100 {
		t.Fatalf("position %s before any mark was written", got)
	}
	settleMark(j, 0)
	settleMark(j, 0) // a repeated call is harmless
	if got := w.Position(); got != 100 {
		t.Fatalf("position %s with the parked event unrecorded", got)
	}
	settleParked(j, 0)
	if got := w.Position(); got != pglogrepl.LSN(200) {
		t.Fatalf("position %s after both rows were written, want 0/C8", got)
	}
	if n := openEvents(s); n != 0 {
		t.Fatalf("%d events still open", n)
	}
}

// TestSessionRefusedMark: an ack that gives up waiting for room among the
// unwritten marks (the session was stopped) leaves the watermark before
// the event and nothing open.
func TestSessionRefusedMark(t *testing.T) {
	w, s0, _ := oneTxn()
	j := fullJanitor(t)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	s := j.Marks(ended, w)
	s.Ack(ref(s0, "a"))
	if w.Position() != 100 || openEvents(s) != 0 {
		t.Fatalf("position %s, %d open", w.Position(), openEvents(s))
	}
}

// fullJanitor is a janitor whose queue of unwritten marks is full.
func fullJanitor(t *testing.T) *Janitor {
	t.Helper()
	j := New(Options{MarkBatch: 10, MarkInterval: time.Second, MaxPending: 1}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	mustMark(t, j, "other", nop)
	return j
}

// makeRoom does what a flush does once it has written the oldest mark.
func makeRoom(j *Janitor) {
	batch := j.take(1)
	j.requeue(len(batch), nil, nil)
}

func queued(j *Janitor, id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, e := range j.pending {
		if e.id == id {
			return true
		}
	}
	return false
}

// TestSessionHandOffAfterFailure: the publisher hands over the acks it had
// received when its session failed, after the session's context ended. An
// ack that finds the janitor's queue full still waits for room, and is
// queued once there is some: not dropped because the context ended
// (review h52; invariant 11, docs/architecture.md).
func TestSessionHandOffAfterFailure(t *testing.T) {
	w, s0, _ := oneTxn()
	j := fullJanitor(t)
	failed, fail := context.WithCancelCause(context.Background())
	fail(errors.New("channel closed by the broker: 404"))
	s := j.Marks(failed, w)
	handed := make(chan struct{})
	go func() { defer close(handed); s.Ack(ref(s0, "a")) }()
	select {
	case <-handed:
		t.Fatalf("the ack returned at once with the queue full (queued: %v): dropped", queued(j, "a"))
	case <-time.After(200 * time.Millisecond):
	}
	makeRoom(j)
	select {
	case <-handed:
	case <-time.After(5 * time.Second):
		t.Fatal("the ack still waits after room was made")
	}
	if !queued(j, "a") || openEvents(s) != 1 {
		t.Fatalf("queued %v, %d open; want the ack queued and open", queued(j, "a"), openEvents(s))
	}
}

// TestSessionHandOffBounded: once the publisher's run is over (Ending; the
// session's context still lives: the publisher failed first), an ack
// waits for room at most handOffGrace, then leaves the watermark before
// the event: a database that does not answer never holds a failed session
// (invariant 5, docs/architecture.md).
func TestSessionHandOffBounded(t *testing.T) {
	w, s0, _ := oneTxn()
	j := fullJanitor(t)
	s := j.Marks(context.Background(), w)
	s.Ending()
	s.Ending() // a second call changes nothing
	began := time.Now()
	handed := make(chan struct{})
	go func() { defer close(handed); s.Ack(ref(s0, "a")) }()
	select {
	case <-handed:
	case <-time.After(handOffGrace + 10*time.Second):
		t.Fatalf("the ack still waits for room %s after the run ended", time.Since(began).Round(time.Millisecond))
	}
	if took := time.Since(began); took < handOffGrace/2 {
		t.Fatalf("the ack gave up after %s, before the grace (%s)", took, handOffGrace)
	}
	if w.Position() != 100 || openEvents(s) != 0 || queued(j, "a") {
		t.Fatalf("position %s, %d open, queued %v", w.Position(), openEvents(s), queued(j, "a"))
	}
}

// TestSessionLateSettleOfEndedSession: a row settled after its session
// ended moves only that session's watermark, never the next one's.
func TestSessionLateSettleOfEndedSession(t *testing.T) {
	j := newTest(10)
	old, s0, _ := oneTxn()
	j.Marks(context.Background(), old).Ack(ref(s0, "a"))
	next, n0, _ := oneTxn() // the next session starts at the slot's position again
	j.Marks(context.Background(), next).Ack(ref(n0, "a"))
	settleMark(j, 0) // the old session's mark, written late
	if got := next.Position(); got != 100 {
		t.Fatalf("a late mark of an ended session moved the new watermark to %s", got)
	}
}

// TestSessionSettled: the reader's drain ends only once the publisher
// drained and every mark is written; the janitor is told to hurry
// meanwhile, and stops hurrying after. Wait returns when its context ends.
func TestSessionSettled(t *testing.T) {
	w, s0, _ := oneTxn()
	j := newTest(10)
	s := j.Marks(context.Background(), w)
	s.Ack(ref(s0, "a"))
	drained := make(chan struct{})
	settled := s.Settled(drained)
	close(drained)
	select {
	case <-settled:
		t.Fatal("settled with a mark unwritten")
	case <-time.After(100 * time.Millisecond):
	}
	select {
	case <-j.wake:
	default:
		t.Fatal("the janitor was not asked to write during the drain")
	}
	if h := hurrying(j); h != 1 {
		t.Fatalf("%d sessions hurry the janitor, want 1", h)
	}
	settleMark(j, 0)
	select {
	case <-settled:
	case <-time.After(5 * time.Second):
		t.Fatal("not settled after the mark was written")
	}
	for deadline := time.Now().Add(5 * time.Second); hurrying(j) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the janitor still hurries after the session settled")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := j.Marks(ctx, w)
	b.Ack(ref(s0, "again"))
	go cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait returned %v before its context ended", err)
	}
}

func hurrying(j *Janitor) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.hurrying
}

// TestIntegrationSessionWaitHurries: while a session waits for its marks
// the janitor writes at once and asks again for a row whose transaction
// is not visible yet, without waiting for its interval (an hour here):
// Wait returns once the rows are marked and the watermark has passed them.
func TestIntegrationSessionWaitHurries(t *testing.T) {
	ctx := context.Background()
	_, db := markJanitor(t, `CREATE TABLE event_outbox (id text PRIMARY KEY, published_at timestamptz);
		INSERT INTO event_outbox (id) VALUES ('a')`)
	late, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	var xid uint32
	if err := late.QueryRow(ctx, `INSERT INTO event_outbox (id) VALUES ('late') RETURNING (txid_current() % 4294967296)::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	j := New(Options{DatabaseURL: db.Config().ConnString(), Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id"}, MarkInterval: time.Hour},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = j.Run(runCtx) }()
	defer func() { stop(); <-ran }()

	w, s0, s1 := oneTxn()
	s := j.Marks(ctx, w)
	s.Ack(ref(s0, "a"))
	lateRef := ref(s1, "late")
	lateRef.Xid = xid
	s.Ack(lateRef)
	committed := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() { committed <- late.Commit(ctx) })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Wait(wctx); err != nil {
		t.Fatalf("Wait: %v (position %s)", err, w.Position())
	}
	if err := <-committed; err != nil { // and db is the test's again
		t.Fatal(err)
	}
	if got := w.Position(); got != 200 {
		t.Fatalf("position %s after Wait, want 0/C8", got)
	}
	var unmarked int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != 0 {
		t.Fatalf("%d rows unmarked after Wait", unmarked)
	}
}
