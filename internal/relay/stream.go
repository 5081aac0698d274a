package relay

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"

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
	budget := r.budget()
	// A confirm loop waiting for room among unwritten marks must end with
	// the session, whichever side fails: hence gctx, not hard.
	g, gctx := errgroup.WithContext(hard)
	sessionAcks := newAcks(gctx, watermark, r.outcomes)
	publisher := publish.NewPublisher(link, events, sessionAcks, budget, r.publisherConfig())
	// ctx ending is the soft stop; hard is the Run context, the hard one.
	reader := wal.NewReader(repl, wal.ReaderConfig{
		Decoder: wal.NewDecoder(r.mapping), Positions: watermark, Out: events,
		Budget: budget, BudgetBytes: int64(r.cfg.MaxInFlightBytes),
		StatusInterval: interval, Timeout: 3 * interval,
		SoftStop: ctx.Done(), Drained: sessionAcks.settled(gctx, publisher.Drained()),
		Turned: r.touch, Log: r.log, Metrics: r.walM,
	})
	r.log.Info("streaming", "from", start, "status_interval", interval)
	r.touch()
	r.setRole(RoleStreaming)
	r.setDetail("")

	stopping, readerDone := outcomesStopping(r.outcomes), make(chan struct{})
	g.Go(func() error { defer close(readerDone); return reader.Run(gctx) })
	g.Go(func() error { return publisher.Run(gctx) })
	g.Go(func() error { return watchStopping(gctx, stopping, readerDone) })
	err := g.Wait()
	if ctx.Err() != nil {
		r.log.Info("stopped", "confirmed", reader.Sent(), "unconfirmed_events", watermark.Pending())
	}
	return err
}

// publisherConfig is the publishers' configuration, the same for every session.
func (r *Relay) publisherConfig() publish.PublisherConfig {
	return publish.PublisherConfig{
		Exchange:    r.cfg.Exchange,
		MaxInFlight: r.cfg.MaxInFlight, MaxInFlightBytes: int64(r.cfg.MaxInFlightBytes),
		ConfirmTimeout:  r.cfg.ConfirmTimeout,
		MaxMessageBytes: int64(r.cfg.MaxMessageBytes), Poison: r.poison, DeadLetterExchange: r.cfg.DeadLetterExchange,
		Log: r.log, Metrics: r.pubM, Refused: r.refused,
	}
}
