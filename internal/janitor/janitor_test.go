package janitor

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

func newTest(batch int) *Janitor {
	return New(Options{MarkBatch: batch, MarkInterval: 100 * time.Millisecond}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
}

func mustMark(t *testing.T, j *Janitor, id string, done func()) {
	t.Helper()
	if err := j.mark(context.Background(), id, 0, done); err != nil {
		t.Fatal(err)
	}
}

func ids(es []entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.id
	}
	return out
}

func nop() {}

// TestMarkBatches: ids come out in batches of MarkBatch in the order they
// were acked, a failed batch goes back in front, and a full batch wakes
// the writer.
func TestMarkBatches(t *testing.T) {
	j := newTest(3)
	for _, id := range []string{"a", "b"} {
		mustMark(t, j, id, nop)
	}
	select {
	case <-j.wake:
		t.Fatal("woken before a batch was full")
	default:
	}
	mustMark(t, j, "c", nop)
	select {
	case <-j.wake:
	default:
		t.Fatal("a full batch did not wake the writer")
	}
	mustMark(t, j, "d", nop)
	first := j.take(math.MaxInt)
	if got := ids(first); len(got) != 3 || got[0] != "a" || got[2] != "c" {
		t.Fatalf("first batch %v", got)
	}
	if j.Pending() != 4 {
		t.Fatalf("a taken batch is not counted as pending: %d", j.Pending())
	}
	j.requeue(len(first), first, nil) // the UPDATE failed
	if got := ids(j.take(math.MaxInt)); len(got) != 3 || got[0] != "a" {
		t.Fatalf("after a failure the batch was not retried first: %v", got)
	}
	if got := ids(j.take(math.MaxInt)); len(got) != 1 || got[0] != "d" {
		t.Fatalf("last batch %v", got)
	}
	if got := j.take(math.MaxInt); len(got) != 0 {
		t.Fatalf("empty queue gave %v", ids(got))
	}
}

// A flush takes only what was queued when it began (flushMarks): ids
// acknowledged while it writes wait for the next one.
func TestMarkTakeLimit(t *testing.T) {
	j := newTest(3)
	for _, id := range []string{"a", "b"} {
		mustMark(t, j, id, nop)
	}
	left := j.queued()
	mustMark(t, j, "c", nop) // acknowledged during the flush
	got := j.take(left)
	if ids(got)[0] != "a" || len(got) != 2 {
		t.Fatalf("a flush that began with 2 queued took %v", ids(got))
	}
	if left -= len(got); left != 0 || j.queued() != 1 {
		t.Fatalf("left %d, queued %d: c waits for the next flush", left, j.queued())
	}
	j.requeue(len(got), nil, nil)
	if got := ids(j.take(j.queued())); len(got) != 1 || got[0] != "c" {
		t.Fatalf("the next flush took %v", got)
	}
}

func TestParkQueue(t *testing.T) {
	j := newTest(10)
	if err := j.park(context.Background(), "x", 7, "bad json", nop); err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.wake:
	default:
		t.Fatal("a parked event did not wake the writer")
	}
	if len(j.parked) != 1 || j.parked[0].id != "x" || j.parked[0].xid != 7 || j.parked[0].reason != "bad json" {
		t.Fatalf("parked queue %+v", j.parked)
	}
}

// TestSettleMarked: a found row's event is done at once. A missing row is
// waited for while its transaction is not visible to new snapshots (a
// commit held by a synchronous standby), however long; once its
// transaction is visible it gets one more flush, and only a row that this
// later flush cannot find either counts as gone. When asking failed,
// nothing changes.
func TestSettleMarked(t *testing.T) {
	j := newTest(10)
	var done []string
	mk := func(id string, xid uint32, visible bool) entry {
		return entry{id: id, xid: xid, visible: visible, done: func() { done = append(done, id) }}
	}
	batch := []entry{
		mk("found", 7, false),
		mk("running", 8, false),
		mk("now-visible", 9, false),
		mk("snapshot-row", 0, false),
		mk("found-late", 10, true),
		mk("gone", 11, true),
	}
	unseen := map[string]bool{"running": true, "now-visible": true, "snapshot-row": true, "gone": true}
	ready, again := j.splitMarked(batch, unseen, map[uint32]bool{8: true}, true)
	for _, e := range ready { // flushMarks calls them once the standbys have the marks
		e.done()
	}
	if got := ids(again); len(got) != 3 || got[0] != "running" || got[1] != "now-visible" || got[2] != "snapshot-row" {
		t.Fatalf("tried again: %v", got)
	}
	if again[0].visible || !again[1].visible || !again[2].visible {
		t.Fatalf("visible after this flush: running %v, now-visible %v, snapshot-row %v; want false, true, true",
			again[0].visible, again[1].visible, again[2].visible)
	}
	if len(done) != 3 || done[0] != "found" || done[1] != "found-late" || done[2] != "gone" {
		t.Fatalf("done: %v", done)
	}
	if n := value(j.metrics.gone); n != 1 {
		t.Fatalf("gone counter %v", n)
	}
	// Asking failed: no row becomes visible, none is gone.
	done = nil
	ready, again = j.splitMarked([]entry{mk("unknown", 12, false)}, map[string]bool{"unknown": true}, nil, false)
	if len(again) != 1 || again[0].visible || len(done) != 0 || len(ready) != 0 {
		t.Fatalf("after a failed question: again %v (visible %v), done %v", ids(again), again[0].visible, done)
	}
}

// TestMarkWaitsForRoom: at MaxPending, Mark waits (never drops) until a
// flush makes room, or returns the context's error. In a synctest bubble
// the 50 ms windows end only once the waiting Mark is blocked.
func TestMarkWaitsForRoom(t *testing.T) { synctest.Test(t, markWaitsForRoom) }

func markWaitsForRoom(t *testing.T) {
	j := New(Options{MarkBatch: 10, MarkInterval: time.Second, MaxPending: 2}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	mustMark(t, j, "a", nop)
	mustMark(t, j, "b", nop)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := j.mark(ctx, "c", 0, nop); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Mark at the bound: %v, want it to wait until the context ends", err)
	}
	if j.Pending() != 2 {
		t.Fatalf("pending %d after a refused Mark, want 2 (nothing dropped)", j.Pending())
	}
	entered := make(chan error, 1)
	go func() { entered <- j.mark(context.Background(), "c", 0, nop) }()
	select {
	case err := <-entered:
		t.Fatalf("Mark returned (%v) without room", err)
	case <-time.After(50 * time.Millisecond):
	}
	batch := j.take(math.MaxInt) // a flush takes both and marks them
	if j.Pending() != 2 {
		t.Fatal("taken entries must still count against the bound")
	}
	j.requeue(len(batch), nil, nil)
	select {
	case err := <-entered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Mark still waits after a flush made room")
	}
	if got := ids(j.take(math.MaxInt)); len(got) != 1 || got[0] != "c" {
		t.Fatalf("queue %v, want [c]", got)
	}
	if n := value(j.metrics.waits); n < 2 {
		t.Fatalf("back-pressure waits counted %v", n)
	}
}

// TestLazyConnectWithBackoff: with nothing queued the janitor never
// connects (a hot standby puts no load on the primary); with work and an
// unreachable database it retries on the backoff schedule, not every tick.
// The janitor runs in a synctest bubble, so its ticks and backoff waits are
// on the bubble's clock: the idle window holds its 50 ticks however loaded
// the machine is. The refusing server runs outside the bubble (a goroutine
// blocked in Accept would keep the bubble's clock from moving).
func TestLazyConnectWithBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			_ = c.Close() // a server that refuses every session
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	synctest.Test(t, func(t *testing.T) { lazyConnectWithBackoff(t, ln.Addr().String(), &dials) })
}

func lazyConnectWithBackoff(t *testing.T, addr string, dials *atomic.Int64) {
	j := New(Options{
		DatabaseURL: "postgres://x@" + addr + "/db?sslmode=disable&connect_timeout=1",
		Outbox:      config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id"}, MarkBatch: 10,
		MarkInterval: 10 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 400 * time.Millisecond,
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(ctx) }()
	time.Sleep(500 * time.Millisecond) // 50 ticks with nothing to do
	// The bubble's clock moves only while Run waits in its select, so Run
	// has taken each of the 50 ticks when Wait returns.
	synctest.Wait()
	if n := value(j.metrics.connects); n != 0 || dials.Load() != 0 {
		t.Fatalf("idle janitor made %v connection attempts (%d dials)", n, dials.Load())
	}
	mustMark(t, j, "a", nop)
	time.Sleep(3 * time.Second) // 300 ticks
	synctest.Wait()
	cancel()
	<-done
	// Schedule 10, 20, 40, ... 400 ms, each jittered down to half at most:
	// at most about 6 + 3s/200ms = 21 attempts (plus the exit flush), far
	// below one per tick.
	n := value(j.metrics.connects)
	t.Logf("%v connection attempts in 3 s at a 10 ms mark interval (%d dials)", n, dials.Load())
	if n < 4 || n > 22 {
		t.Fatalf("%v connection attempts in 3 s, want between 4 and 22 (the backoff schedule)", n)
	}
	if j.Pending() != 1 {
		t.Fatalf("the unwritten mark was dropped: pending %d", j.Pending())
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
