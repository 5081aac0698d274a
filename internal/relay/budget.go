package relay

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// newBudget is a session's byte budget (CDCRELAY_MAX_IN_FLIGHT_BYTES): one
// bound on the bytes of every event between the WAL and the broker,
// decoded and waiting or published and unconfirmed (invariant 6,
// docs/architecture.md). The producer of the publisher's input takes an
// event's weight before sending it; the publisher gives it back once the
// event's confirm or park is handled. A session's budget dies with it.
func (r *Relay) newBudget() *meteredBudget {
	b := &meteredBudget{w: semaphore.NewWeighted(int64(r.cfg.MaxInFlightBytes))}
	r.inFlight.Store(b) // the gauge follows the newest session's
	return b
}

// meteredBudget is a byte budget that tells how much of it is taken
// (cdcrelay_in_flight_bytes). A session's goroutines take and give back;
// the gauge reads held from the scrape's goroutine.
type meteredBudget struct {
	w    *semaphore.Weighted
	held atomic.Int64
}

func (b *meteredBudget) Acquire(ctx context.Context, n int64) error {
	if err := b.w.Acquire(ctx, n); err != nil {
		return err
	}
	b.held.Add(n)
	return nil
}

func (b *meteredBudget) TryAcquire(n int64) bool {
	if !b.w.TryAcquire(n) {
		return false
	}
	b.held.Add(n)
	return true
}

func (b *meteredBudget) Release(n int64) {
	b.held.Add(-n)
	b.w.Release(n)
}

// inFlightBytes is what the newest session's budget holds (0 before one).
func (r *Relay) inFlightBytes() float64 {
	if b := r.inFlight.Load(); b != nil {
		return float64(b.held.Load())
	}
	return 0
}

// budgeted forwards events from in to out, each once its weight is taken
// from budget, and closes out when in is closed: the backfill's way into
// the budget (the reader takes it itself, see wal.ReaderConfig.Budget).
func (r *Relay) budgeted(ctx context.Context, budget *meteredBudget, in <-chan wal.Event, out chan<- wal.Event) error {
	defer close(out)
	limit := int64(r.cfg.MaxInFlightBytes)
	for ev := range in {
		if err := budget.Acquire(ctx, ev.Weight(limit)); err != nil {
			return err
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
