package relay

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// stream runs the reader and the publisher until failure or stop: ctx
// ending is the soft stop (the reader reads no more, the publisher
// drains, the final status update reports the marks), lost ending (the
// slot lock lost, before or during the drain) the hard one (pipeline.go).
func (r *Relay) stream(ctx, lost context.Context, repl *pgconn.PgConn, link *publish.Link, start pglogrepl.LSN, interval time.Duration) error {
	p := r.newPipeline(ctx, lost, link, progress.NewWatermark(start))
	gate := r.newOriginGate(p.watermark, start, interval) // with origin 'none' only (origingate.go)
	reader := wal.NewReader(repl, wal.ReaderConfig{
		Decoder: wal.NewDecoder(r.mapping), Positions: gate, Out: p.events,
		Budget: p.budget, BudgetBytes: int64(r.cfg.MaxInFlightBytes),
		StatusInterval: interval, Timeout: 3 * interval,
		SoftStop: ctx.Done(), Settled: gate.Settled(p.settled()),
		Turned: r.touch, Log: r.log, Metrics: r.walM,
	})
	r.log.Info("streaming", "from", start, "status_interval", interval)
	r.touch()
	r.setRole(RoleStreaming)
	r.clearDetail()

	dbShuttingDown, readerDone := r.janitor.DatabaseShuttingDown(), make(chan struct{})
	err := p.run(
		func(ctx context.Context) error { defer close(readerDone); return reader.Run(ctx) },
		func(ctx context.Context) error { return watchDatabaseShutdown(ctx, dbShuttingDown, readerDone) },
		func(ctx context.Context) error { return gate.run(ctx, readerDone) },
	)
	if ctx.Err() != nil {
		r.log.Info("stopped", "confirmed", reader.Sent(), "unconfirmed_events", p.watermark.Pending())
		return err
	}
	if err != nil {
		r.windDown(ctx, err, p.watermark, p.marks, reader, p.publisher)
	}
	return err
}

// windDownWait bounds how long a failed session waits for the marks of
// the events the broker acknowledged before it failed.
const windDownWait = 2 * time.Second

// windDown runs after a failed session, before the next one starts from
// the slot: it waits (briefly) for the marks of what the broker did
// acknowledge, hands the next session what it needs to skip and where to
// go carefully (publish.Carryover), and reports the position those marks
// allow. Without it a broker that refuses one message would make every
// session publish the same acknowledged events again (invariant 11, docs/architecture.md).
func (r *Relay) windDown(ctx context.Context, err error, watermark *progress.Watermark, marks *janitor.Marks, reader *wal.Reader, publisher *publish.Publisher) {
	wctx, cancel := context.WithTimeout(ctx, windDownWait)
	defer cancel()
	_ = marks.Wait(wctx) // what is not marked by then is published again: harmless
	if at, id, ok := watermark.Done(); ok {
		r.carryover.Done(at, id)
	}
	for _, e := range watermark.DoneAhead() {
		r.carryover.DoneAhead(e.At, e.ID)
	}
	last, ok := publisher.Last()
	r.carryover.Failed(last, ok, publish.Refusal(err))
	// The replication connection is fine when the broker side failed; if
	// it is not, this fails and the slot keeps its last position.
	if cerr := reader.ReportPosition(); cerr != nil {
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
		Unroutable: r.unroutable, Timeline: uint32(r.system.Timeline), Carryover: r.carryover, OnBlocked: r.onBlocked,
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
