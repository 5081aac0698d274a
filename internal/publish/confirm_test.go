package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Unit tests of the confirm pipeline over the fake broker
// (fakebroker_test.go) for what the model test (model_test.go) does not
// check: the byte budget's bound, and the confirm timeout, which the
// model's clockless broker never lets fire, paused while the broker
// blocks publishers.

// recordingAcker counts the acks and parks the publisher reports.
type recordingAcker struct {
	mu    sync.Mutex
	acked []string
}

func (a *recordingAcker) Resumed(Ref) {}

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
	b := newFakeBroker(1, 1)
	_, link := b.connect(cfg.MaxInFlight)
	r := &confirmRig{t: t, b: b, in: make(chan wal.Event, 64), acks: &recordingAcker{}, done: make(chan error, 1),
		budget: semaphore.NewWeighted(cfg.MaxInFlightBytes), maxBytes: cfg.MaxInFlightBytes}
	cfg.Exchange = b.exchange
	cfg.MaxMessageBytes = 1 << 20
	cfg.Log = slog.New(slog.DiscardHandler)
	r.p = NewPublisher(link, r.in, r.acks, r.budget, cfg)
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

// waitFor waits until cond holds, failing after 10s (never a speed check).
func (r *confirmRig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			r.t.Fatalf("after 10s: %s", what)
		}
	}
}

func confirmEvent(i int) wal.Event {
	return wal.Event{Seq: uint64(i + 1), ID: fmt.Sprintf("e%d", i), RoutingKey: "k", Payload: []byte(`{"n":1}`), PayloadIsJSON: true}
}

// TestPublisherHoldsNoMoreThanTheByteBudget: unconfirmed messages never
// weigh more than MaxInFlightBytes, whatever room the window has; each
// confirm lets the next one through (invariant 6, docs/architecture.md).
func TestPublisherHoldsNoMoreThanTheByteBudget(t *testing.T) {
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
	// The publisher is now waiting for bytes: several turns of nothing.
	time.Sleep(100 * time.Millisecond)
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
}

// TestPublisherConfirmTimeout: a message the broker never confirms ends
// Run with ErrConfirmTimeout, and nothing is acked.
func TestPublisherConfirmTimeout(t *testing.T) {
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
}

// TestPublisherConfirmTimeoutPausedWhileBlocked: while the broker blocks
// publishers (a resource alarm), a missing confirm is flow control, not a
// failure: the timeout does not fire, the late confirm is taken, and the
// publisher drains normally.
func TestPublisherConfirmTimeoutPausedWhileBlocked(t *testing.T) {
	const timeout = 50 * time.Millisecond
	r := startConfirmRig(t, PublisherConfig{MaxInFlight: 8, MaxInFlightBytes: 1 << 20, ConfirmTimeout: timeout})
	r.b.block(true)
	r.waitFor("the publisher saw the block", r.p.blocked.Load)
	r.send(confirmEvent(0))
	r.waitFor("the event published", func() bool { return r.published() == 1 })
	time.Sleep(10 * timeout)
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
}
