package relay

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// This file is the one place a session's stop is decided, for streaming
// and adoption alike (docs/architecture.md, "Stopping"). A pipeline stops
// in three phases:
//
//  1. soft: the relay's ctx ended (SIGTERM). The feeder (the WAL reader,
//     or an adoption's snapshot) takes in no more and closes the
//     publisher's input.
//  2. drained: the publisher has the confirm of every message it sent and
//     the janitor has marked their rows; the pipeline's goroutines return.
//  3. hard: CDCRELAY_SHUTDOWN_TIMEOUT after soft, at once when the session
//     is lost (the slot lock: abort), before or during the drain, or when
//     the pipeline returns. Every goroutine ends, and a publish blocked in
//     a socket write is freed by closing the socket (invariant 5).
//
// A stage that fails ends the group's context (pipeline.ctx), not the
// hard stop: the other stages return, and a publish blocked in a socket
// write is freed a second later (abortIfStuck).

// stopper owns one pipeline's soft and hard stops.
type stopper struct {
	soft context.Context //nolint:containedctx // its end is the soft stop
	// hard ends at the hard stop; it is not a child of soft, so that the
	// drain outlives the soft stop.
	hard   context.Context //nolint:containedctx // the stop's phases are contexts
	cancel context.CancelFunc
	undo   []func() bool

	mu    sync.Mutex
	timer *time.Timer // the soft stop's deadline, once soft ended
}

// newStopper starts the stop of a pipeline: soft ends it gracefully
// within timeout, abort at once, whether or not soft ended first. abort
// must not end with soft (the session's lost, not its work). onHard runs
// when the hard stop comes before close.
func newStopper(soft, abort context.Context, timeout time.Duration, onHard func()) *stopper {
	hard, cancel := context.WithCancel(context.WithoutCancel(abort))
	s := &stopper{soft: soft, hard: hard, cancel: cancel}
	s.undo = []func() bool{
		context.AfterFunc(soft, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.timer = time.AfterFunc(timeout, cancel)
		}),
		context.AfterFunc(abort, cancel),
		context.AfterFunc(hard, onHard),
	}
	return s
}

// stopped reports whether the soft stop has come.
func (s *stopper) stopped() bool { return s.soft.Err() != nil }

// close ends the stopper once the pipeline has returned: a hard stop that
// has not come by then no longer runs onHard, and the soft stop's
// deadline is dropped.
func (s *stopper) close() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	s.cancel()
}

// pipeline carries one session's events from a feeder to the broker, and
// their confirms back through the janitor's marks to a watermark: what
// stream and backlog share. Its goroutines run in one errgroup under the
// hard stop.
type pipeline struct {
	stop      *stopper
	watermark *progress.Watermark
	budget    *meteredBudget
	events    chan wal.Event // the publisher's input; the feeder closes it
	marks     *janitor.Marks
	publisher *publish.Publisher
	g         *errgroup.Group
	// ctx ends at the hard stop or with the first stage to fail. Stages
	// run under it; a confirm loop waiting for room among the unwritten
	// marks ends with it too, whichever side failed.
	ctx context.Context //nolint:containedctx // the group's context, as errgroup hands it out
}

// newPipeline builds a session's pipeline on link. soft and abort are its
// stops (stopper); progress counts every confirm (an adoption's).
func (r *Relay) newPipeline(soft, abort context.Context, link *publish.Link, watermark *progress.Watermark, progress ...interface{ Inc() }) *pipeline {
	p := &pipeline{
		stop:      newStopper(soft, abort, r.cfg.ShutdownTimeout, link.Abort),
		watermark: watermark,
		budget:    r.newBudget(),
		events:    make(chan wal.Event, eventBuffer),
	}
	p.g, p.ctx = errgroup.WithContext(p.stop.hard)
	p.marks = r.janitor.Marks(p.ctx, watermark, progress...)
	p.publisher = publish.NewPublisher(link, p.events, p.marks, p.budget, r.publisherConfig())
	return p
}

// settled is closed once the publisher is drained (its input closed, every
// confirm handled) and the janitor has marked their rows: the drained
// phase (janitor.Marks.Settled).
func (p *pipeline) settled() <-chan struct{} { return p.marks.Settled(p.publisher.Drained()) }

// run runs the publisher and the stages given, and returns once all have:
// the first failure ends the rest (hard). Each stage gets the pipeline's
// context.
func (p *pipeline) run(stages ...func(context.Context) error) error {
	defer p.stop.close()
	p.g.Go(func() error { return p.publisher.Run(p.ctx) })
	for _, stage := range stages {
		p.g.Go(func() error { return stage(p.ctx) })
	}
	return p.g.Wait()
}

// feedContext is the context a feeder reads under: it ends at the soft
// stop, so that the feeder closes the publisher's input and the rest
// drains, or with the pipeline.
func (p *pipeline) feedContext() (context.Context, context.CancelFunc) {
	feed, cancel := context.WithCancel(p.ctx)
	stop := context.AfterFunc(p.stop.soft, cancel)
	return feed, func() { stop(); cancel() }
}

// fed is the result of a feeder that read under feed (feedContext): an
// end the soft stop caused is a clean one, whatever error the read
// reported for it (a cancelled query, a closed cursor).
func (p *pipeline) fed(feed context.Context, err error) error {
	if err != nil && feed.Err() != nil && p.stop.stopped() && p.ctx.Err() == nil {
		return nil
	}
	return err
}
