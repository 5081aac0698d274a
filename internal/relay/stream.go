package relay

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// stream runs the reader and the publisher until failure or stop.
func (r *Relay) stream(ctx context.Context, repl *pgconn.PgConn, link *publish.Link, start pglogrepl.LSN, interval time.Duration) error {
	// hard ends the session at once; ctx only asks it to drain, and the
	// drain gets ShutdownTimeout before hard follows.
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopDrain := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancel) })
	defer stopDrain()
	// When hard ends the session, a publish blocked in a socket write (a
	// broker that stopped reading) would still hold it: close the socket
	// (invariant 5, docs/architecture.md).
	defer context.AfterFunc(hard, link.Abort)()

	watermark := slot.NewWatermark(start)
	events := make(chan wal.Event, eventBuffer)
	budget := r.newBudget()
	// A confirm loop waiting for room among unwritten marks must end with
	// the session, whichever side fails: hence gctx, not hard.
	g, gctx := errgroup.WithContext(hard)
	marks := r.janitor.Session(gctx, watermark)
	publisher := publish.NewPublisher(link, events, marks, budget, r.publisherConfig())
	// ctx ending is the soft stop (SoftStop: read no more, drain, report);
	// gctx, under hard, ends the reader at once.
	gate := r.newOriginGate(watermark, start, interval) // with origin 'none' only (origingate.go)
	reader := wal.NewReader(repl, wal.ReaderConfig{
		Decoder: wal.NewDecoder(r.mapping), Positions: gate, Out: events,
		Budget: budget, BudgetBytes: int64(r.cfg.MaxInFlightBytes),
		StatusInterval: interval, Timeout: 3 * interval,
		SoftStop: ctx.Done(), Settled: gate.Settled(marks.Settled(publisher.Drained())),
		Turned: r.touch, Log: r.log, Metrics: r.walM,
	})
	r.log.Info("streaming", "from", start, "status_interval", interval)
	r.touch()
	r.setRole(RoleStreaming)
	r.clearDetail()

	dbShuttingDown, readerDone := r.janitor.DatabaseShuttingDown(), make(chan struct{})
	g.Go(func() error { defer close(readerDone); return reader.Run(gctx) })
	g.Go(func() error { return publisher.Run(gctx) })
	g.Go(func() error { return watchDatabaseShutdown(gctx, dbShuttingDown, readerDone) })
	g.Go(func() error { return gate.run(gctx, readerDone) })
	err := g.Wait()
	if ctx.Err() != nil {
		r.log.Info("stopped", "confirmed", reader.Sent(), "unconfirmed_events", watermark.Pending())
		return err
	}
	if err != nil {
		r.windDown(ctx, err, watermark, marks, reader, publisher)
	}
	return err
}

// windDownWait bounds how long a failed session waits for the marks of
// the events the broker acknowledged before it failed.
const windDownWait = 2 * time.Second

// windDown runs after a failed session, before the next one starts from
// the slot: it waits (briefly) for the marks of what the broker did
// acknowledge, hands the next session what it needs to skip and where to
// go carefully (publish.Resume), and reports the position those marks
// allow. Without it a broker that refuses one message would make every
// session publish the same acknowledged events again (invariant 11, docs/architecture.md).
func (r *Relay) windDown(ctx context.Context, err error, watermark *slot.Watermark, marks *janitor.Session, reader *wal.Reader, publisher *publish.Publisher) {
	wctx, cancel := context.WithTimeout(ctx, windDownWait)
	defer cancel()
	_ = marks.Wait(wctx) // what is not marked by then is published again: harmless
	if at, id, ok := watermark.Done(); ok {
		r.resume.Done(at, id)
	}
	for _, e := range watermark.DoneAhead() {
		r.resume.DoneAhead(e.At, e.ID)
	}
	last, ok := publisher.Last()
	r.resume.Failed(last, ok, publish.Refusal(err))
	// The replication connection is fine when the broker side failed; if
	// it is not, this fails and the slot keeps its last position.
	if cerr := reader.Confirm(); cerr != nil {
		r.log.Debug("final status update after a failed session", "error", cerr)
	}
}

// publisherConfig is the publishers' configuration: the same for every
// session but the timeline, the one noteSystem recorded for this session.
func (r *Relay) publisherConfig() publish.PublisherConfig {
	return publish.PublisherConfig{
		Exchange:    r.cfg.Exchange,
		MaxInFlight: r.cfg.MaxInFlight, MaxInFlightBytes: int64(r.cfg.MaxInFlightBytes),
		ConfirmTimeout:  r.cfg.ConfirmTimeout,
		MaxMessageBytes: int64(r.cfg.MaxMessageBytes), Poison: r.poison, DeadLetterExchange: r.cfg.DeadLetterExchange,
		Unroutable: r.unroutable, Timeline: uint32(r.system.Timeline), Resume: r.resume, OnBlocked: r.onBlocked,
		Log: r.log, Metrics: r.pubM, Refused: r.refused,
	}
}

// onBlocked tells /readyz that the broker blocks publishers: the relay
// stays ready (a restart would not help) and says what it waits for.
func (r *Relay) onBlocked(active bool, reason string) {
	if active {
		r.setDetail(ReasonBrokerBlocked, "broker blocked publishers (resource alarm: "+reason+"); waiting, nothing is lost")
		return
	}
	r.clearDetail()
}
