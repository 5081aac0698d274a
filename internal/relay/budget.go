package relay

import (
	"context"

	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// budget is a session's byte budget (CDCRELAY_MAX_IN_FLIGHT_BYTES): one
// bound on the bytes of every event between the WAL and the broker,
// decoded and waiting or published and unconfirmed (invariant 6,
// docs/reliability.md). The producer of the publisher's input takes an
// event's weight before sending it; the publisher gives it back once the
// event's confirm or park is handled. A session's budget dies with it.
func (r *Relay) budget() *semaphore.Weighted {
	return semaphore.NewWeighted(int64(r.cfg.MaxInFlightBytes))
}

// budgeted forwards events from in to out, each once its weight is taken
// from budget, and closes out when in is closed: the backfill's way into
// the budget (the reader takes it itself, see wal.ReaderConfig.Budget).
func (r *Relay) budgeted(ctx context.Context, budget *semaphore.Weighted, in <-chan wal.Event, out chan<- wal.Event) error {
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
