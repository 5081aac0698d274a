package janitor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/publish"
)

// Marks is the publisher's Acker for one streaming session or one
// adoption: it hands each acknowledged or parked event to the janitor and,
// once the event's row is marked, parked or found gone, acks the session's
// watermark. So the slot never passes a row that is not marked (invariant
// 10, docs/architecture.md).
//
// Concurrency: Ack and Resumed run on the publisher's confirm loops, also
// after the session ended (the publisher hands over the confirms it had
// received: publish's handOver). Parked runs there too (a return, a nack,
// a dead-letter copy's fate) and on the publish loops: Publisher.poison
// parks an event the library or the broker refused before it was sent.
// Ack and Parked may block their caller, whichever loop it is, while the
// janitor's queue is full (maxParked parked events, or MaxPending marks),
// until room comes or handCtx ends. Ending runs on any goroutine; the
// janitor's Run goroutine settles the events (markDone); Wait may run
// anywhere. mu guards open and idle. A markDone arriving after
// the session ended moves only that session's own, discarded watermark.
type Marks struct {
	j *Janitor
	// ctx is the session's. Ack has no ctx parameter (publish.Acker).
	ctx context.Context //nolint:containedctx // see above
	// handCtx bounds a hand-off's wait for room among the unwritten marks
	// (back-pressure on the confirm loop). It lives as long as the session
	// does, and handOffGrace longer once the session ended with a failure
	// (ctx ended, or the publisher said Ending): the acks the broker sent
	// before the failure still reach the janitor, and a database that does
	// not answer cannot hold the session for good (invariant 5,
	// docs/architecture.md). A stop (ctx ended with context.Canceled) ends
	// it at once: the stop's deadline is its caller's.
	handCtx   context.Context //nolint:containedctx // see above
	endHand   context.CancelFunc
	ending    sync.Once
	watermark *progress.Watermark
	progress  []interface{ Inc() } // each counts every confirm (an adoption's progress)

	mu   sync.Mutex
	open int           // events handed to the janitor and not settled
	idle chan struct{} // closed whenever open is zero; a fresh one while it is not
}

// Marks starts a session whose events move watermark. ctx bounds the
// waits for room in the janitor's queue; progress counters are
// incremented at each confirm.
func (j *Janitor) Marks(ctx context.Context, watermark *progress.Watermark, progress ...interface{ Inc() }) *Marks {
	idle := make(chan struct{})
	close(idle)
	handCtx, endHand := context.WithCancel(context.WithoutCancel(ctx))
	s := &Marks{j: j, ctx: ctx, handCtx: handCtx, endHand: endHand, watermark: watermark, progress: progress, idle: idle}
	context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), context.Canceled) {
			endHand()
			return
		}
		s.Ending()
	})
	return s
}

// handOffGrace is how long, once its session ended with a failure, a
// hand-off still waits for room among the unwritten marks. The relay waits
// as long for the marks of a failed session before it records the resume
// place (relay's windDown): a mark that finds no room by then could not be
// written in time anyway, and its event is published again, a duplicate
// and never a loss, since the watermark does not pass it (invariant 10,
// docs/architecture.md).
const handOffGrace = 2 * time.Second

// Ending says that the publisher's run is over: what it hands on from now
// on are the confirms it had received, and a hand-off waits for room at
// most handOffGrace more. Safe to call more than once, from any
// goroutine; the session's own end (ctx) calls it too.
func (s *Marks) Ending() {
	s.ending.Do(func() { time.AfterFunc(handOffGrace, s.endHand) })
}

// Ack queues an acknowledged event's row to be marked published_at.
func (s *Marks) Ack(ev publish.Ref) {
	s.hand(ev, func(done func()) error { return s.j.mark(s.handCtx, ev.ID, ev.Xid, done) })
}

// Parked queues a poison event to be recorded on its row; it was never
// published as is.
func (s *Marks) Parked(ev publish.Ref, reason string) {
	s.hand(ev, func(done func()) error { return s.j.park(s.handCtx, ev.ID, ev.Xid, reason, done) })
}

// Resumed moves the watermark past an event an earlier session had acked
// and marked (publish.Carryover): its row needs nothing more.
func (s *Marks) Resumed(ev publish.Ref) {
	s.count()
	s.watermark.MarkDone(ev.Seq, ev.At, ev.ID)
}

func (s *Marks) count() {
	for _, c := range s.progress {
		c.Inc()
	}
}

// hand gives ev to the janitor through give; the janitor calls done from
// Run when the row is settled (once; a second call does nothing). A give
// refused because no room came before handCtx ended leaves the slot
// before ev (invariant 10): the next session publishes ev again.
func (s *Marks) hand(ev publish.Ref, give func(done func()) error) {
	s.count()
	s.opened(1)
	var settled atomic.Bool // a repeated call must not settle twice
	done := func() {
		if settled.CompareAndSwap(false, true) {
			s.markDone(ev)
		}
	}
	if give(done) != nil {
		s.opened(-1)
	}
}

// markDone moves the watermark past a settled event (progress.Watermark.MarkDone).
func (s *Marks) markDone(ev publish.Ref) {
	s.watermark.MarkDone(ev.Seq, ev.At, ev.ID)
	s.opened(-1)
}

// opened adds delta to the open events, closing idle when none is left
// and arming a fresh one when the first opens.
func (s *Marks) opened(delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.open
	s.open += delta
	switch {
	case was == 0 && s.open > 0:
		s.idle = make(chan struct{})
	case was > 0 && s.open == 0:
		close(s.idle)
	}
}

// Wait returns nil once every event handed to the janitor so far is
// settled, or ctx's error. Meanwhile the janitor writes at once instead
// of at its interval (hurry): a graceful stop's final status update then
// includes the marks of everything the broker acknowledged.
func (s *Marks) Wait(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	default:
	}
	defer s.j.hurry()()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Settled returns a channel closed once after is closed and then every
// event is settled (Wait); it is never closed if the session's context
// ends first. The reader's drain waits for it (wal.ReaderConfig.Settled).
func (s *Marks) Settled(after <-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		select {
		case <-after:
		case <-s.ctx.Done():
			return // the reader sees the context end by itself
		}
		if s.Wait(s.ctx) == nil {
			close(out)
		}
	}()
	return out
}

// hurryPause is the pause between two writes while a session waits for
// its last marks: rows whose transaction is not yet visible (splitMarked)
// are asked for again after it rather than in a tight loop.
const hurryPause = 10 * time.Millisecond

// hurry asks Run to write at once, and again after each write while
// anything is queued, until the returned function is called.
func (j *Janitor) hurry() (done func()) {
	j.mu.Lock()
	j.hurrying++
	j.mu.Unlock()
	j.Flush()
	return func() {
		j.mu.Lock()
		j.hurrying--
		j.mu.Unlock()
	}
}

// hurryOn schedules the next write while a session waits for its marks:
// after hurryPause, or when the backoff after a failure ends. Run
// goroutine only (it owns again).
func (j *Janitor) hurryOn() {
	j.mu.Lock()
	waiting := j.hurrying > 0 && len(j.pending)+j.held+len(j.parked) > 0
	j.mu.Unlock()
	if !waiting {
		return
	}
	wait := max(time.Until(j.retryAt), hurryPause)
	if j.again == nil {
		j.again = time.AfterFunc(wait, j.Flush)
		return
	}
	j.again.Reset(wait)
}
