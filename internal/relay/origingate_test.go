package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// These test the origin gate's logic (origingate.go) with a real
// watermark and a check that is a function: no service. The gate's tests
// run in a synctest bubble: its pacing is on the bubble's clock, so a
// window of "no check" holds every turn the gate would take in it, and
// the count of checks under steady flow does not depend on the machine's
// load.

// fakeCheck answers the gate's checks: foreign origins or an error, and
// a hook run during the check (to receive more while it runs).
type fakeCheck struct {
	mu      sync.Mutex
	calls   []time.Time
	foreign []string
	err     error
	during  func()
}

func (f *fakeCheck) check(context.Context) ([]string, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	during, foreign, err := f.during, f.foreign, f.err
	f.during = nil
	f.mu.Unlock()
	if during != nil {
		during()
	}
	return foreign, err
}

func (f *fakeCheck) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

type testGate struct {
	*originGate
	wm      *progress.Watermark
	checks  *fakeCheck
	foreign atomic.Bool
	done    chan struct{} // closed as if the reader had returned
	errc    chan error
}

// startGate runs an active gate from start over a new watermark, pacing
// checks at interval; the test's end stops it.
func startGate(t *testing.T, start pglogrepl.LSN, interval time.Duration, marks <-chan struct{}) (*testGate, <-chan struct{}) {
	t.Helper()
	tg := &testGate{wm: progress.NewWatermark(start), checks: &fakeCheck{}, done: make(chan struct{}), errc: make(chan error, 1)}
	g := &originGate{inner: tg.wm, active: true, interval: interval, timeout: time.Second,
		nudge: make(chan struct{}, 1), log: slog.New(slog.DiscardHandler)}
	g.received.Store(uint64(start))
	g.verified.Store(uint64(start))
	g.check, g.done, g.foreign = tg.checks.check, func() {}, func() { tg.foreign.Store(true) }
	tg.originGate = g
	settled := g.Settled(marks)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { tg.errc <- g.run(ctx, tg.done) }()
	t.Cleanup(func() {
		cancel()
		<-tg.errc
	})
	return tg, settled
}

// commit streams one transaction of one event, acknowledged at once.
func (tg *testGate) commit(end pglogrepl.LSN) {
	tg.Begin()
	seq := tg.NextSeq()
	tg.Commit(end)
	tg.wm.MarkDone(seq, wal.Place{}, "")
}

// waitPosition polls Position, as the reader's loop does, until it is want.
func (tg *testGate) waitPosition(t *testing.T, want pglogrepl.LSN, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := tg.Position()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("position %s after %s; want %s", got, within, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOriginGateHoldsThePositionUntilAFreshCheck(t *testing.T) {
	synctest.Test(t, originGateHoldsThePositionUntilAFreshCheck)
}

func originGateHoldsThePositionUntilAFreshCheck(t *testing.T) {
	tg, _ := startGate(t, 100, 50*time.Millisecond, nil)
	// A commit received while the check runs is not covered by it: its
	// transaction's origin may have been created after the check's snapshot.
	tg.checks.mu.Lock()
	tg.checks.during = func() { tg.commit(300) }
	tg.checks.mu.Unlock()
	tg.commit(200)
	if got := tg.Position(); got != 100 {
		t.Fatalf("position %s before any check; want 100 (the start)", got)
	}
	tg.waitPosition(t, 200, time.Second)
	if tg.verified.Load() != 200 {
		t.Fatalf("verified %d after the first check; want 200, what came before it", tg.verified.Load())
	}
	// The next check covers it, no sooner than one interval after the first.
	tg.waitPosition(t, 300, time.Second)
	c := tg.checks
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls) != 2 || c.calls[1].Sub(c.calls[0]) < 50*time.Millisecond {
		t.Fatalf("checks at %v; want two, an interval apart", c.calls)
	}
}

func TestOriginGateForeignOriginEndsTheSessionUnconfirmed(t *testing.T) {
	synctest.Test(t, originGateForeignOriginEndsTheSessionUnconfirmed)
}

func originGateForeignOriginEndsTheSessionUnconfirmed(t *testing.T) {
	tg, _ := startGate(t, 100, 10*time.Millisecond, nil)
	tg.commit(200)
	tg.waitPosition(t, 200, time.Second)
	tg.checks.mu.Lock()
	tg.checks.foreign = []string{"pg_16390"}
	tg.checks.mu.Unlock()
	tg.commit(300)
	tg.Position()
	select {
	case err := <-tg.errc:
		tg.errc <- err // for the cleanup
		if !errors.Is(err, errForeignOrigin) {
			t.Fatalf("run returned %v; want errForeignOrigin", err)
		}
	case <-time.After(time.Second):
		t.Fatal("run did not end the session")
	}
	if got := tg.Position(); got != 200 {
		t.Fatalf("position %s after the foreign origin; want 200, the last checked", got)
	}
	if !tg.foreign.Load() {
		t.Fatal("the relay was not told of the foreign origin")
	}
}

func TestOriginGateIdleChecksNothing(t *testing.T) { synctest.Test(t, originGateIdleChecksNothing) }

func originGateIdleChecksNothing(t *testing.T) {
	tg, _ := startGate(t, 100, time.Millisecond, nil)
	tg.commit(200)
	tg.waitPosition(t, 200, time.Second)
	n := tg.checks.count()
	// A keepalive inside an open transaction moves nothing the reader
	// could confirm: no check either.
	tg.Begin()
	tg.Keepalive(500)
	for range 50 {
		tg.Position()
		time.Sleep(2 * time.Millisecond)
	}
	if got := tg.checks.count(); got != n {
		t.Fatalf("%d checks while the position did not move; want none", got-n)
	}
}

func TestOriginGatePacesChecksUnderSteadyFlow(t *testing.T) {
	synctest.Test(t, originGatePacesChecksUnderSteadyFlow)
}

func originGatePacesChecksUnderSteadyFlow(t *testing.T) {
	const interval = 100 * time.Millisecond
	tg, _ := startGate(t, 100, interval, nil)
	start := time.Now()
	var worst time.Duration
	at := map[pglogrepl.LSN]time.Time{}
	for lsn := pglogrepl.LSN(200); time.Since(start) < 10*interval; lsn += 100 {
		tg.commit(lsn)
		at[lsn] = time.Now()
		p := tg.Position()
		for l, t0 := range at {
			if l <= p {
				worst = max(worst, time.Since(t0))
				delete(at, l)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	n := tg.checks.count()
	if n < 5 || n > 11 {
		t.Fatalf("%d checks in %s of steady flow with a %s interval; want about one per interval", n, 10*interval, interval)
	}
	// A position waits for the next check after it: at most about one
	// interval (plus the test's own turns).
	if worst > 2*interval {
		t.Fatalf("a received position waited %s for a check; want about one interval (%s) at most", worst, interval)
	}
}

func TestOriginGateFinalCheckOnGracefulStop(t *testing.T) {
	synctest.Test(t, originGateFinalCheckOnGracefulStop)
}

func originGateFinalCheckOnGracefulStop(t *testing.T) {
	marks := make(chan struct{})
	tg, settled := startGate(t, 100, time.Hour, marks)
	tg.commit(200)
	tg.waitPosition(t, 200, time.Second) // the first check: the interval starts
	tg.commit(300)
	if got := tg.Position(); got != 200 {
		t.Fatalf("position %s; want 200 until the next check, an hour away", got)
	}
	close(marks)
	select {
	case <-settled:
	case <-time.After(time.Second):
		t.Fatal("the reader's Settled did not close after the marks settled")
	}
	if got := tg.Position(); got != 300 {
		t.Fatalf("position %s for the final status; want 300: the last check covers what the stop acknowledged", got)
	}
}

func TestOriginGateCheckFailureEndsTheSession(t *testing.T) {
	synctest.Test(t, originGateCheckFailureEndsTheSession)
}

func originGateCheckFailureEndsTheSession(t *testing.T) {
	tg, _ := startGate(t, 100, time.Millisecond, nil)
	tg.checks.mu.Lock()
	tg.checks.err = errors.New("connection refused")
	tg.checks.mu.Unlock()
	tg.commit(200)
	tg.Position()
	select {
	case err := <-tg.errc:
		tg.errc <- err
		if err == nil || errors.Is(err, errForeignOrigin) {
			t.Fatalf("run returned %v; want the check's failure", err)
		}
	case <-time.After(time.Second):
		t.Fatal("a failed check did not end the session")
	}
	if got := tg.Position(); got != 100 {
		t.Fatalf("position %s; want 100, nothing checked", got)
	}
}

func TestOriginGateInactivePassesThrough(t *testing.T) {
	wm := progress.NewWatermark(100)
	r := &Relay{log: slog.New(slog.DiscardHandler)} // skipOrigins false: the session decodes every origin
	g := r.newOriginGate(wm, 100, time.Millisecond)
	marks := make(chan struct{})
	if g.Settled(marks) != (<-chan struct{})(marks) {
		t.Fatal("an inactive gate stands between the reader and the marks")
	}
	if err := g.run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	g.Begin()
	seq := g.NextSeq()
	g.Commit(200)
	wm.MarkDone(seq, wal.Place{}, "")
	if got := g.Position(); got != 200 {
		t.Fatalf("position %s; want the watermark's, 200", got)
	}
}
