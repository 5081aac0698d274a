package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// acks hands each confirm to the outcomes recorder (the janitor), and its
// completion to the watermark: an event counts as done for the slot only
// once its row is marked (or parked, or gone). Without a recorder the ack
// goes straight to the watermark. A late callback of an ended session only moves that
// session's own, discarded watermark: harmless.
type acks struct {
	ctx       context.Context //nolint:containedctx // the session's: Ack has no ctx parameter (publish.Acker), and a wait for room in the recorder must end with the session
	watermark *slot.Watermark
	outcomes  Outcomes
	open      *atomic.Int64        // events handed to outcomes and not done yet
	count     []interface{ Inc() } // each counts every confirm (an adoption's progress)
}

func newAcks(ctx context.Context, watermark *slot.Watermark, outcomes Outcomes) acks {
	return acks{ctx: ctx, watermark: watermark, outcomes: outcomes, open: new(atomic.Int64)}
}

func (a acks) Ack(ev publish.Ref) {
	a.hand(ev, func(done func()) error { return a.outcomes.Mark(a.ctx, ev.ID, ev.Xid, done) })
}

// Parked moves the watermark past a poison event once it is recorded on
// its row (or recording proved impossible): never published as is.
func (a acks) Parked(ev publish.Ref, reason string) {
	a.hand(ev, func(done func()) error { return a.outcomes.Park(a.ctx, ev.ID, reason, done) })
}

// Resumed moves the watermark past an event an earlier session had acked
// and marked (publish.Resume): its row needs nothing more.
func (a acks) Resumed(ev publish.Ref) {
	for _, c := range a.count {
		c.Inc()
	}
	a.watermark.AckAt(ev.Seq, ev.At, ev.ID)
}

// hand gives event seq to outcomes through give, whose done callback
// acks the watermark; without outcomes the watermark is acked at once.
func (a acks) hand(ev publish.Ref, give func(done func()) error) {
	for _, c := range a.count {
		c.Inc()
	}
	if a.outcomes == nil {
		a.watermark.AckAt(ev.Seq, ev.At, ev.ID)
		return
	}
	a.open.Add(1)
	if give(a.done(ev.Seq, ev.At, ev.ID)) != nil {
		a.open.Add(-1) // the session is ending; the slot stays before this event
	}
}

func (a acks) done(seq uint64, at wal.Place, id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.watermark.AckAt(seq, at, id)
			a.open.Add(-1)
		})
	}
}

// settled returns a channel closed once after is closed and every event
// handed to outcomes is done (or ctx ends), asking it to write
// at once: the final status update of a graceful stop then includes the
// marks written during the drain.
func (a acks) settled(ctx context.Context, after <-chan struct{}) <-chan struct{} {
	if a.outcomes == nil {
		return after
	}
	out := make(chan struct{})
	go func() {
		select {
		case <-after:
		case <-ctx.Done():
			return // the reader sees ctx end by itself
		}
		a.wait(ctx)
		close(out)
	}()
	return out
}

// wait returns once every event handed to outcomes is done, or ctx ends.
func (a acks) wait(ctx context.Context) {
	if a.outcomes == nil {
		return
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for a.open.Load() > 0 {
		a.outcomes.Flush()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}
