package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Unit tests of the confirm pipeline over the fake broker
// (fakebroker_test.go) for what the model test (model_test.go) does not
// check: the byte budget's bound; the confirm timeout, which the model's
// clockless broker never lets fire, paused while the broker blocks
// publishers; the hand-over of the acks received before a channel closed;
// the first message to a row's exchange going alone.

// recordingAcker counts the acks and parks the publisher reports.
type recordingAcker struct {
	mu    sync.Mutex
	acked []string
}

func (a *recordingAcker) Resumed(Ref) {}
func (a *recordingAcker) Ending()     {}

func (a *recordingAcker) Ack(ev Ref) {
	id := ev.ID
	a.mu.Lock()
	a.acked = append(a.acked, id)
	a.mu.Unlock()
}
func (a *recordingAcker) Parked(ev Ref, _ string) {
	id := ev.ID
	a.mu.Lock()
	a.acked = append(a.acked, "parked:"+id)
	a.mu.Unlock()
}

func (a *recordingAcker) count() int { a.mu.Lock(); defer a.mu.Unlock(); return len(a.acked) }

func (a *recordingAcker) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.acked...)
}

// confirmRig runs one publisher over a fake broker that confirms only
// when the test says.
type confirmRig struct {
	t  *testing.T
	b  *fakeBroker
	in chan wal.Event
	// budget is the session's byte budget: send takes each event's weight
	// before handing it on, as the WAL reader does; the publisher gives it
	// back.
	budget   *semaphore.Weighted
	maxBytes int64
	ctx      context.Context //nolint:containedctx // ends with the test: a send waiting for bytes gives up
	acks     *recordingAcker
	p        *Publisher
	done     chan error
}

func startConfirmRig(t *testing.T, cfg PublisherConfig) *confirmRig {
	t.Helper()
	acks := &recordingAcker{}
	return startConfirmRigWith(t, cfg, acks, acks)
}

// startConfirmRigWith is startConfirmRig with the publisher's Acker, which
// reports to rec.
func startConfirmRigWith(t *testing.T, cfg PublisherConfig, acker Acker, rec *recordingAcker) *confirmRig {
	t.Helper()
	b := newFakeBroker(1, 1)
	_, link := b.connect(cfg.MaxInFlight)
	r := &confirmRig{t: t, b: b, in: make(chan wal.Event, 64), acks: rec, done: make(chan error, 1),
		budget: semaphore.NewWeighted(cfg.MaxInFlightBytes), maxBytes: cfg.MaxInFlightBytes}
	cfg.Exchange = b.exchange
	cfg.MaxMessageBytes = 1 << 20
	cfg.Log = slog.New(slog.DiscardHandler)
	r.p = newPublisher(link, r.in, acker, r.budget, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx = ctx
	go func() { r.done <- r.p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("publisher did not return after its context ended")
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, p := range b.problems {
			t.Error(p)
		}
	})
	return r
}

// send hands ev to the publisher once its weight fits in the budget,
// reporting whether it did before the test ended.
func (r *confirmRig) send(ev wal.Event) bool {
	if r.budget.Acquire(r.ctx, ev.Weight(r.maxBytes)) != nil {
		return false
	}
	select {
	case r.in <- ev:
		return true
	case <-r.ctx.Done():
		return false
	}
}

func (r *confirmRig) published() int {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	return r.b.stats.published
}

// waitFor fails unless cond holds once every goroutine of the test's
// bubble (testing/synctest) waits: nothing else can happen before a timer
// fires, so cond is not a matter of speed.
func (r *confirmRig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	synctest.Wait()
	if !cond() {
		r.t.Fatalf("once every goroutine waits: not %s", what)
	}
}

func confirmEvent(i int) wal.Event {
	return wal.Event{Seq: uint64(i + 1), ID: fmt.Sprintf("e%d", i), RoutingKey: "k", Payload: []byte(`{"n":1}`), PayloadIsJSON: true}
}

// TestPublisherHoldsNoMoreThanTheByteBudget: unconfirmed messages never
// weigh more than MaxInFlightBytes, whatever room the window has; each
// confirm lets the next one through (invariant 6, docs/architecture.md).
func TestPublisherHoldsNoMoreThanTheByteBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := confirmEvent(0)
		const fit = 3
		budget := fit*ev.Weight(1<<30) + ev.Weight(1<<30)/2 // room for 3, not 4
		r := startConfirmRig(t, PublisherConfig{MaxInFlight: 100, MaxInFlightBytes: budget, ConfirmTimeout: time.Hour})
		go func() { // the feeder waits for bytes as the WAL reader does; it ends with the rig
			for i := range 10 {
				if !r.send(confirmEvent(i)) {
					return
				}
			}
		}()
		r.waitFor("3 events published", func() bool { return r.published() == fit })
		// The publisher is now waiting for bytes: let every goroutine run until
		// it waits.
		synctest.Wait()
		if n := r.published(); n != fit {
			t.Fatalf("%d messages unconfirmed with a byte budget for %d", n, fit)
		}
		for want := fit + 1; want <= 10; want++ {
			r.b.confirmBurst(1)
			r.waitFor(fmt.Sprintf("message %d published after a confirm", want), func() bool { return r.published() == want })
			if unconfirmed := r.published() - r.acks.count(); unconfirmed > fit {
				t.Fatalf("%d messages unconfirmed, budget for %d", unconfirmed, fit)
			}
		}
	})
}

// TestPublisherConfirmTimeout: a message the broker never confirms ends
// Run with ErrConfirmTimeout, and nothing is acked.
func TestPublisherConfirmTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startConfirmRig(t, PublisherConfig{MaxInFlight: 8, MaxInFlightBytes: 1 << 20, ConfirmTimeout: 100 * time.Millisecond})
		r.send(confirmEvent(0))
		select {
		case err := <-r.done:
			if !errors.Is(err, ErrConfirmTimeout) {
				t.Fatalf("Run: %v, want ErrConfirmTimeout", err)
			}
			r.done <- err // for the cleanup
		case <-time.After(10 * time.Second):
			t.Fatal("no confirm timeout")
		}
		if n := r.acks.count(); n != 0 {
			t.Fatalf("%d acks without a confirm", n)
		}
	})
}

// TestPublisherConfirmTimeoutPausedWhileBlocked: while the broker blocks
// publishers (a resource alarm), a missing confirm is flow control, not a
// failure: the timeout does not fire, the late confirm is taken, and the
// publisher drains normally.
func TestPublisherConfirmTimeoutPausedWhileBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 50 * time.Millisecond
		r := startConfirmRig(t, PublisherConfig{MaxInFlight: 8, MaxInFlightBytes: 1 << 20, ConfirmTimeout: timeout})
		r.b.block(true)
		r.waitFor("the publisher saw the block", r.p.blocked.Load)
		r.send(confirmEvent(0))
		r.waitFor("the event published", func() bool { return r.published() == 1 })
		time.Sleep(10 * timeout) // the bubble's clock: ten timeouts pass at once
		synctest.Wait()
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("Run ended while the broker blocked publishers: %v", err)
		default:
		}
		r.b.confirmBurst(1)
		r.waitFor("the late confirm taken", func() bool { return r.acks.count() == 1 })
		r.b.block(false)
		close(r.in)
		select {
		case err := <-r.done:
			r.done <- err // for the cleanup
			if err != nil {
				t.Fatalf("Run after the drain: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("not drained after the confirm")
		}
		select {
		case <-r.p.Drained():
		default:
			t.Fatal("Run returned nil without closing Drained")
		}
		if n := r.acks.count(); n != 1 {
			t.Fatalf("%d acks, want 1", n)
		}
	})
}

// gateAcker holds its first Ack until Ending is called (or a second
// passes), as the janitor's session holds an ack while its queue of
// unwritten marks is full.
type gateAcker struct {
	*recordingAcker
	entered  chan struct{} // closed once the first Ack waits
	gate     chan struct{} // closed by Ending
	once     sync.Once
	first    atomic.Bool
	byEnding atomic.Bool // the first Ack was let go by Ending, not the timer
}

func newGateAcker() *gateAcker {
	return &gateAcker{recordingAcker: &recordingAcker{}, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (a *gateAcker) Ack(ev Ref) {
	if a.first.CompareAndSwap(false, true) {
		close(a.entered)
		select {
		case <-a.gate:
			a.byEnding.Store(true)
		case <-time.After(time.Second):
		}
	}
	a.recordingAcker.Ack(ev)
}

func (a *gateAcker) Ending() { a.once.Do(func() { close(a.gate) }) }

// TestConfirmLoopHandsOverAcksBeforeClose (review h52): the broker acks
// e1..e5 while the confirm loop is still busy handing over e0 (its Acker
// waits), then closes the channel with a 404. The acks it sent before the
// close are handed over, in publish order, before Run returns, and
// nothing after the first message it did not ack (invariants 1 and 11,
// docs/architecture.md); and an Acker that waits learns at once that the
// run is over (Ending), so a failed session cannot wait for it for good
// (invariant 5). On the old relay the loop picked at random between the
// resolved confirms and the ended context, and dropped the rest.
func TestConfirmLoopHandsOverAcksBeforeClose(t *testing.T) {
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				acks := newGateAcker()
				r := startConfirmRigWith(t, PublisherConfig{MaxInFlight: 16, MaxInFlightBytes: 1 << 20, ConfirmTimeout: time.Hour}, acks, acks.recordingAcker)
				for i := range 10 {
					r.send(confirmEvent(i))
				}
				r.waitFor("10 events published", func() bool { return r.published() == 10 })
				r.b.confirmBurst(1)
				<-acks.entered
				r.b.confirmBurst(5)
				r.b.mu.Lock()
				r.b.conn.chans[0].shutdown(&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'gone'", Server: true})
				r.b.mu.Unlock()
				var err error
				select {
				case err = <-r.done:
					r.done <- err // for the cleanup
				case <-time.After(10 * time.Second):
					t.Fatal("Run still running 10s after the channel closed")
				}
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("Run: %v, want ErrClosed", err)
				}
				want := []string{"e0", "e1", "e2", "e3", "e4", "e5"}
				if got := acks.list(); !slices.Equal(got, want) {
					t.Fatalf("acks handed over %v, want %v: the broker acked them before the close", got, want)
				}
				if !acks.byEnding.Load() {
					t.Fatal("the Acker waiting in Ack was not told that the run was over (Ending)")
				}
			})
		})
	}
}

// TestFirstMessageToRowExchangeGoesAlone: the first message to a row's
// exchange (CDCRELAY_EXCHANGE_COLUMN) waits until its lane has nothing
// else in flight and goes alone; once a confirm shows the exchange exists
// the next ones go within the window. So a missing exchange, which makes
// the broker close the channel without the confirms it still owed, never
// has messages it took in flight beside it (review h52; invariant 11,
// docs/architecture.md). The fake broker knows one exchange besides the
// relay's, its dead-letter one: here it stands for the row's exchange.
func TestFirstMessageToRowExchangeGoesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startConfirmRig(t, PublisherConfig{MaxInFlight: 16, MaxInFlightBytes: 1 << 20, ConfirmTimeout: time.Hour})
		r.b.mu.Lock()
		r.b.dlx = "row.x"
		r.b.mu.Unlock()
		toRow := func(i int) wal.Event { ev := confirmEvent(i); ev.Exchange = "row.x"; return ev }
		for i := range 5 {
			r.send(confirmEvent(i))
		}
		r.waitFor("5 events published", func() bool { return r.published() == 5 })
		r.send(toRow(5))
		r.send(confirmEvent(6))
		stays := func(n int, why string) {
			t.Helper()
			synctest.Wait()
			if got := r.published(); got != n {
				t.Fatalf("%d published, want %d: %s", got, n, why)
			}
		}
		stays(5, "the first message to the row's exchange went out with 5 unconfirmed before it")
		r.b.confirmBurst(5)
		r.waitFor("the row's message published once the lane drained", func() bool { return r.published() == 6 })
		stays(6, "a message went out beside the first one to the row's exchange")
		r.b.confirmBurst(1)
		r.waitFor("the next message published after the confirm", func() bool { return r.published() == 7 })
		r.send(toRow(7)) // the exchange is known now: no wait for e6
		r.waitFor("a second message to the row's exchange published within the window", func() bool { return r.published() == 8 })
		r.b.confirmBurst(2)
		r.waitFor("every confirm handled", func() bool { return r.acks.count() == 8 })
		if got, want := r.acks.list(), []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7"}; !slices.Equal(got, want) {
			t.Fatalf("acks %v, want %v", got, want)
		}
	})
}
