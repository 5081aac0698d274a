package relay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// marksFakeMarker records completion callbacks instead of writing rows.
type marksFakeMarker struct {
	mu      sync.Mutex
	dones   []func()
	flushes int
	refuse  error
	// failSince and failErr are what Failing reports.
	failSince time.Time
	failErr   error
}

func (f *marksFakeMarker) Failing() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failSince, f.failErr
}

func (f *marksFakeMarker) Mark(_ context.Context, _ string, _ uint32, done func()) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return f.refuse
	}
	f.dones = append(f.dones, done)
	return nil
}

func (f *marksFakeMarker) Park(ctx context.Context, id, _ string, done func()) error {
	return f.Mark(ctx, id, 0, done)
}

func (f *marksFakeMarker) Flush() {
	f.mu.Lock()
	f.flushes++
	f.mu.Unlock()
}

func (f *marksFakeMarker) done(i int) {
	f.mu.Lock()
	d := f.dones[i]
	f.mu.Unlock()
	d()
}

// marksOneTxn is a watermark at 100 with one transaction of two events
// ending at 200.
func marksOneTxn() (*slot.Watermark, uint64, uint64) {
	w := slot.NewWatermark(100)
	w.Begin()
	a, b := w.Event(), w.Event()
	w.Commit(200)
	return w, a, b
}

// TestAcksWaitForMarks: a broker ack alone does not move the watermark;
// the marker's callback does, once per event however often it is called.
// Parked events count only once recorded, too.
func TestAcksWaitForMarks(t *testing.T) {
	w, s0, s1 := marksOneTxn()
	m := &marksFakeMarker{}
	a := newAcks(context.Background(), w, m)
	a.Ack(publish.Ref{Seq: s0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	a.Parked(publish.Ref{Seq: s1, ID: "b", At: wal.Place{CommitLSN: 150, Index: int(s1)}}, "poison")
	if got := w.Position(); got != 100 {
		t.Fatalf("position %s before any mark was written", got)
	}
	m.done(0)
	m.done(0) // a repeated callback is harmless
	if got := w.Position(); got != 100 {
		t.Fatalf("position %s with the parked event unrecorded", got)
	}
	m.done(1)
	if got := w.Position(); got != pglogrepl.LSN(200) {
		t.Fatalf("position %s after both rows were written, want 0/C8", got)
	}
	if n := a.open.Load(); n != 0 {
		t.Fatalf("%d events still open", n)
	}
}

// TestAcksWithoutMarker: without a marker (the fault tests) the broker ack
// moves the watermark at once.
func TestAcksWithoutMarker(t *testing.T) {
	w, s0, s1 := marksOneTxn()
	a := newAcks(context.Background(), w, nil)
	a.Ack(publish.Ref{Seq: s0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	a.Parked(publish.Ref{Seq: s1, ID: "b", At: wal.Place{CommitLSN: 150, Index: int(s1)}}, "poison")
	if got := w.Position(); got != 200 {
		t.Fatalf("position %s", got)
	}
}

// TestAcksRefusedMark: a marker that gives up waiting for room (the
// session ends) leaves the watermark before the event and nothing open.
func TestAcksRefusedMark(t *testing.T) {
	w, s0, _ := marksOneTxn()
	a := newAcks(context.Background(), w, &marksFakeMarker{refuse: context.Canceled})
	a.Ack(publish.Ref{Seq: s0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	if w.Position() != 100 || a.open.Load() != 0 {
		t.Fatalf("position %s, %d open", w.Position(), a.open.Load())
	}
}

// TestAcksLateCallbackOfEndedSession: a callback arriving after its
// session ended moves only that session's watermark, never the next one's.
func TestAcksLateCallbackOfEndedSession(t *testing.T) {
	old, s0, _ := marksOneTxn()
	m := &marksFakeMarker{}
	newAcks(context.Background(), old, m).Ack(publish.Ref{Seq: s0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	next, n0, _ := marksOneTxn() // the next session starts at the slot's position again
	newAcks(context.Background(), next, m).Ack(publish.Ref{Seq: n0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(n0)}})
	m.done(0) // the old session's mark, written late
	if got := next.Position(); got != 100 {
		t.Fatalf("a late callback of an ended session moved the new watermark to %s", got)
	}
}

// TestAcksSettled: the reader's drain ends only once the publisher drained
// and every mark is written; the marker is asked to flush meanwhile.
func TestAcksSettled(t *testing.T) {
	w, s0, _ := marksOneTxn()
	m := &marksFakeMarker{}
	a := newAcks(context.Background(), w, m)
	a.Ack(publish.Ref{Seq: s0, ID: "a", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	drained := make(chan struct{})
	settled := a.settled(context.Background(), drained)
	close(drained)
	select {
	case <-settled:
		t.Fatal("settled with a mark unwritten")
	case <-time.After(100 * time.Millisecond):
	}
	m.mu.Lock()
	flushes := m.flushes
	m.mu.Unlock()
	if flushes == 0 {
		t.Fatal("the marker was not asked to flush during the drain")
	}
	m.done(0)
	select {
	case <-settled:
	case <-time.After(5 * time.Second):
		t.Fatal("not settled after the mark was written")
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := newAcks(ctx, w, m)
	b.Ack(publish.Ref{Seq: s0, ID: "again", At: wal.Place{CommitLSN: 150, Index: int(s0)}})
	go cancel()
	b.wait(ctx)
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("wait returned before its context ended")
	}
}
